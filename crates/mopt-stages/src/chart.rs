//! `chart.svg`: accuracy against latency, one point per stage (the baseline included), drawn as
//! plain SVG (kept stages filled, rolled-back ones hollow).

use crate::gate::Action;
use crate::record::{Headline, StageRecord};

/// One point of the chart.
#[derive(Debug, Clone)]
pub struct Point {
    /// The point's label (the stage).
    pub label: String,
    /// Latency, ms.
    pub x: f64,
    /// Test accuracy.
    pub y: f64,
    /// Whether the stage was kept.
    pub kept: bool,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The points of a run: the test headline metric (accuracy in %) against mopt CPU p50 latency at batch 32 (or FLOPs per
/// example when latency was not measured). Returns the x-axis label too.
pub fn points(records: &[StageRecord], h: Headline) -> (Vec<Point>, &'static str) {
    let have_latency = records.iter().all(|r| r.model.latency_at(32).is_some());
    let pts = records
        .iter()
        .map(|r| Point {
            label: format!("{} {}", r.index, r.name),
            x: if have_latency {
                r.model.latency_at(32).map_or(0.0, |l| l.p50_ms)
            } else {
                r.model.flops_per_example as f64 / 1e9
            },
            y: h.chart(h.of(&r.model.test)),
            kept: matches!(r.decision.action, Action::Kept | Action::Baseline),
        })
        .collect();
    let axis = if have_latency {
        "mopt CPU latency, p50 at batch 32 (ms)"
    } else {
        "forward GFLOPs per example"
    };
    (pts, axis)
}

/// The SVG text of a scatter chart.
pub fn svg(title: &str, x_label: &str, y_label: &str, points: &[Point]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 440.0, 70.0, 30.0, 40.0, 60.0);
    let range = |v: Vec<f64>| {
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let pad = ((hi - lo) * 0.15).max(hi.abs() * 0.02).max(1e-9);
        (lo - pad, hi + pad)
    };
    let (x0, x1) = range(points.iter().map(|p| p.x).collect());
    let (y0, y1) = range(points.iter().map(|p| p.y).collect());
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let sy = |y: f64| h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        w / 2.0,
        esc(title)
    );
    s += &format!(
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let (xv, yv) = (x0 + f * (x1 - x0), y0 + f * (y1 - y0));
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{xv:.1}</text>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{yv:.1}</text>\n",
            sx(xv),
            h - bottom + 18.0,
            left - 6.0,
            sy(yv) + 4.0
        );
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n<text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">{}</text>\n",
        (left + w - right) / 2.0,
        h - 16.0,
        esc(x_label),
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0,
        esc(y_label)
    );
    let mut placed: Vec<(f64, f64)> = Vec::new();
    for p in points {
        let (cx, cy) = (sx(p.x), sy(p.y));
        // Stages that pass their model on unchanged share a point: stack their labels.
        let stacked = placed
            .iter()
            .filter(|(x, y)| (x - cx).abs() < 1.0 && (y - cy).abs() < 1.0)
            .count() as f64;
        placed.push((cx, cy));
        s += &format!(
            "<g class=\"point\"><circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"6\" fill=\"{}\" stroke=\"#1f4e9c\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\">{} ({:.2}, {:.2})</text></g>\n",
            if p.kept { "#1f4e9c" } else { "white" },
            cx + 9.0,
            cy - 8.0 + 15.0 * stacked,
            esc(&p.label),
            p.x,
            p.y
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_circle_per_point_and_labels_are_escaped() {
        let pts = vec![
            Point {
                label: "0 teacher".into(),
                x: 300.0,
                y: 84.3,
                kept: true,
            },
            Point {
                label: "1 a<b>".into(),
                x: 150.0,
                y: 82.6,
                kept: false,
            },
        ];
        let s = svg("t", "x", "y", &pts);
        assert_eq!(s.matches("<circle").count(), 2);
        assert!(s.contains("a&lt;b&gt;") && s.contains("fill=\"white\""));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        // A point shared by two stages gets two labels, one under the other.
        let mut same = pts.clone();
        same.push(Point {
            label: "2 export".into(),
            ..pts[1].clone()
        });
        let s = svg("t", "x", "y", &same);
        let y_of = |label: &str| -> String {
            let i = s.find(label).unwrap();
            let tag = &s[s[..i].rfind("<text").unwrap()..i];
            tag.split("y=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .to_string()
        };
        assert_ne!(y_of("1 a&lt;b&gt;"), y_of("2 export"));
    }
}
