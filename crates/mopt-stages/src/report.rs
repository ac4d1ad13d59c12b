//! `report.md`, `report.json` and `chart.svg` of a run: a row per stage (the baseline first), the
//! golden reference, the baseline analysis, each stage's notes and the environment.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use crate::analysis::Analysis;
use crate::chart;
use crate::env::Environment;
use crate::error::StageError;
use crate::gate::Action;
use crate::record::{short_sha, shown, write_json_atomic, Headline, ModelFacts, StageRecord};
use crate::Pipeline;

/// `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineReport {
    /// The run's name.
    pub run: String,
    /// The headline metric (its family's): the tables' columns and deltas, the chart.
    pub metric: String,
    /// The recipe file.
    pub recipe: String,
    /// The run folder.
    pub run_dir: String,
    /// The baseline (index 0) and every stage that ran, in order.
    pub stages: Vec<StageRecord>,
    /// The model the run ends with (the last passing stage's output), copied to `<run>/best`.
    pub final_model: ModelFacts,
    /// The final stage's name.
    pub final_stage: String,
    /// The golden reference.
    pub golden: GoldenSummary,
    /// The baseline's analysis, when the family has one.
    pub analysis: Option<Analysis>,
    /// Where it was measured.
    pub environment: Environment,
    /// Wall time of the run.
    pub wall_time_s: f64,
    /// Peak resident memory.
    pub peak_rss_bytes: Option<u64>,
    /// The chart's file.
    pub chart: String,
}

/// Where the golden reference is and what it holds.
#[derive(Debug, Clone, Serialize)]
pub struct GoldenSummary {
    /// `golden.json`.
    pub file: String,
    /// Examples in it.
    pub examples: usize,
    /// The split they come from.
    pub split: &'static str,
    /// sha256 of the baseline they were computed with.
    pub baseline_sha256: String,
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

fn lat(m: &ModelFacts, batch: usize) -> String {
    m.latency_at(batch)
        .map_or("-".into(), |l| format!("{:.1} / {:.1}", l.p50_ms, l.p90_ms))
}

fn model_cells(h: Headline, m: &ModelFacts) -> String {
    format!(
        "{:.4} | {:.4} | {:.2}M | {:.2} | {:.1} | {} | {}",
        h.of(&m.valid),
        h.of(&m.test),
        m.params as f64 / 1e6,
        m.flops_per_example as f64 / 1e9,
        mib(m.checkpoint_bytes),
        lat(m, 1),
        lat(m, 32)
    )
}

/// The markdown report.
pub fn markdown(r: &PipelineReport) -> String {
    let mut s = format!("# Run report: {}\n\n", r.run);
    let _ = writeln!(
        s,
        "Recipe `{}`, run folder `{}`; wall time {:.0} s, peak RSS {:.0} MiB. The final model is stage **{}**'s output (copied to `{}/best`).\n",
        r.recipe,
        r.run_dir,
        r.wall_time_s,
        r.peak_rss_bytes.map_or(0.0, mib),
        r.final_stage,
        r.run_dir
    );
    let h = Headline::named(&r.metric);
    push_stage_table(&mut s, h, &r.stages);
    push_references(&mut s, h, &r.stages);
    let _ = writeln!(s, "\n![{} against latency](chart.svg)\n", h.0.name());
    push_decisions(&mut s, &r.stages);
    push_stage_details(&mut s, &r.stages);
    push_golden(&mut s, &r.golden);
    if let Some(a) = &r.analysis {
        push_analysis(&mut s, a);
    }
    push_environment(&mut s, &r.environment);
    s
}

/// The `## Stages` section: its preamble and one table row per stage.
fn push_stage_table(s: &mut String, h: Headline, stages: &[StageRecord]) {
    let seq = stages
        .first()
        .and_then(|b| b.model.latency.first())
        .map_or(0, |l| l.seq_len);
    s.push_str("## Stages\n\n");
    let _ = writeln!(
        s,
        "Decisions use the validation split only; test {} is reported, never used to decide. Latency: mopt on this CPU, p50 / p90 ms at batch 1 and 32{}. FLOPs: forward, per example.\n",
        h.0.name(),
        if seq > 0 { format!(" x {seq} tokens") } else { String::new() }
    );
    let c = h.column();
    let _ = writeln!(s, "| # | stage | kind | decision | valid {c} | test {c} | params | GFLOPs/ex | ckpt MiB | b1 ms | b32 ms | Δ valid vs baseline | Δ test vs baseline | max logit err vs input / baseline | wall s | peak RSS MiB |");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for st in stages {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {:.2e} / {:.2e} | {:.0} | {:.0} |",
            st.index,
            st.name,
            st.kind,
            st.decision.action.label(),
            model_cells(h, &st.model),
            h.delta(st.delta_valid_vs_baseline),
            h.delta(st.delta_test_vs_baseline),
            st.max_logit_error_vs_input,
            st.max_logit_error_vs_baseline,
            st.wall_time_s,
            st.peak_rss_bytes.map_or(0.0, mib)
        );
    }
}

/// The table of models reported beside the chain, when any stage has some.
fn push_references(s: &mut String, h: Headline, stages: &[StageRecord]) {
    let refs: Vec<_> = stages.iter().flat_map(|st| st.references.iter()).collect();
    if !refs.is_empty() {
        let c = h.column();
        let _ = write!(s, "\nReported beside the chain (not passed on):\n\n| model | about | valid {c} | test {c} | params | GFLOPs/ex | ckpt MiB | b1 ms | b32 ms |\n|---|---|---|---|---|---|---|---|---|\n");
        for rf in refs {
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                rf.name,
                rf.about,
                model_cells(h, &rf.model)
            );
        }
    }
}

/// The `## Decisions` section: one bullet per stage.
fn push_decisions(s: &mut String, stages: &[StageRecord]) {
    s.push_str("## Decisions\n\n");
    for st in stages {
        let _ = writeln!(
            s,
            "- **{} {}** ({}): {}",
            st.index,
            st.name,
            st.decision.action.label(),
            st.decision.reason
        );
    }
}

/// The `## Stage details` section: input, output, settings and notes of each stage.
fn push_stage_details(s: &mut String, stages: &[StageRecord]) {
    s.push_str("\n## Stage details\n\n");
    for st in stages {
        let _ = writeln!(s, "### {} {} ({})\n", st.index, st.name, st.kind);
        if let Some(i) = &st.input {
            let _ = writeln!(s, "- input `{}` (sha256 {}…)", i.path, short_sha(&i.sha256));
        }
        let _ = writeln!(
            s,
            "- output `{}` (sha256 {}…): {}",
            st.model.checkpoint,
            short_sha(&st.model.sha256),
            st.model.describe
        );
        for line in &st.settings {
            let _ = writeln!(s, "- {line}");
        }
        for n in &st.notes {
            let _ = writeln!(s, "- {n}");
        }
        s.push('\n');
    }
}

/// The `## Golden reference` section.
fn push_golden(s: &mut String, g: &GoldenSummary) {
    let _ = writeln!(
        s,
        "## Golden reference\n\nThe baseline's logits on the first {} examples of the {} split (`{}`, baseline sha256 {}…); every stage's max logit error is measured on them.\n",
        g.examples,
        g.split,
        g.file,
        short_sha(&g.baseline_sha256)
    );
}

/// The `## Baseline analysis` section: one table row per module.
fn push_analysis(s: &mut String, a: &Analysis) {
    let _ = writeln!(
        s,
        "## Baseline analysis\n\nWhere the baseline's parameters, FLOPs and forward time go at {} tokens (summed module times: {:.1} ms at batch 1, {:.1} ms at batch 32).\n",
        a.seq_len, a.forward_ms_b1, a.forward_ms_b32
    );
    let total: usize = a.rows.iter().map(|m| m.params).sum();
    let flops: u64 = a.rows.iter().map(|m| m.flops_per_example).sum();
    s.push_str("| module | params | share of params | GFLOPs/ex | share of FLOPs | time share b1 | time share b32 |\n|---|---|---|---|---|---|---|\n");
    for m in &a.rows {
        let _ = writeln!(
            s,
            "| {} | {:.2}M | {:.1}% | {:.3} | {:.1}% | {:.1}% | {:.1}% |",
            m.module,
            m.params as f64 / 1e6,
            100.0 * m.params as f64 / total.max(1) as f64,
            m.flops_per_example as f64 / 1e9,
            100.0 * m.flops_per_example as f64 / flops.max(1) as f64,
            100.0 * m.time_share_b1,
            100.0 * m.time_share_b32
        );
    }
    s.push('\n');
}

/// The `## Environment` section (the report's last line).
fn push_environment(s: &mut String, e: &Environment) {
    let _ = writeln!(
        s,
        "## Environment\n\nmopt {}, Burn {}; CPU {} ({} logical CPUs, {} threads), SIMD {}, mopt GEMM path {}, bf16 products {}; {}.",
        e.mopt_version,
        e.burn_version,
        e.cpu_model,
        e.logical_cpus,
        e.threads,
        e.simd.join(" "),
        e.gemm_path,
        e.bf16_path,
        e.os
    );
}

pub(crate) fn write_report(
    p: &Pipeline,
    run_dir: &Path,
    records: &[StageRecord],
    final_model: &ModelFacts,
    (golden_examples, device): (usize, &burn::prelude::Device),
    wall_time_s: f64,
    baseline_ckpt: &Path,
) -> Result<PipelineReport, StageError> {
    let recipe = &p.recipe;
    let analysis = if recipe.evaluation.analysis {
        eprintln!("analysis: where the baseline's time goes");
        p.registry.recipe_family(recipe)?.analyse(
            baseline_ckpt,
            recipe.evaluation.seq_len(p.registry.example_size(recipe)?),
            recipe.evaluation.latency_runs.max(3) / 3,
            device,
        )?
    } else {
        None
    };
    // The stage that produced the final model (later stages may pass it on unchanged).
    let final_stage = records
        .iter()
        .find(|r| {
            matches!(r.decision.action, Action::Kept | Action::Baseline)
                && r.model.sha256 == final_model.sha256
        })
        .map_or("baseline".into(), |r| format!("{} {}", r.index, r.name));
    let h = Headline(p.registry.recipe_family(recipe)?.metric());
    let (points, x_label) = chart::points(records, h);
    let chart_path = run_dir.join("chart.svg");
    std::fs::write(
        &chart_path,
        chart::svg(
            &format!(
                "{}: test {} against speed, one point per stage",
                recipe.run.name,
                h.0.name()
            ),
            x_label,
            &h.chart_label(),
            &points,
        ),
    )
    .map_err(|e| StageError::io(&chart_path, e))?;
    let report = PipelineReport {
        run: recipe.run.name.clone(),
        metric: h.0.name().into(),
        recipe: shown(&recipe.path),
        run_dir: shown(run_dir),
        stages: records.to_vec(),
        final_model: final_model.clone(),
        final_stage,
        golden: GoldenSummary {
            file: shown(&run_dir.join("golden.json")),
            examples: golden_examples,
            split: "validation",
            baseline_sha256: records[0].model.sha256.clone(),
        },
        analysis,
        environment: Environment::detect(),
        wall_time_s,
        peak_rss_bytes: mopt_train::memory::peak_rss_bytes(),
        chart: shown(&chart_path),
    };
    write_json_atomic(&run_dir.join("report.json"), &report)?;
    let md = run_dir.join("report.md");
    std::fs::write(&md, markdown(&report)).map_err(|e| StageError::io(&md, e))?;
    Ok(report)
}
