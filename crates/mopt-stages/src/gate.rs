//! Gate decisions: a stage's validation metric against the baseline or its input, and its logit
//! error against its input, under the stage's `[stage.gate]` tolerances.

use mopt_recipe::{worse_keys, GateReference, GateSpec, OnFail};
use mopt_train::metrics::EvalMetrics;
use serde::{Deserialize, Serialize};

/// What the runner did with a stage's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The golden baseline the stages start from.
    Baseline,
    /// Passed (or had no gate): the next stage starts from this output.
    Kept,
    /// Failed with `on-fail = "rollback"`: the next stage starts from the last passing model.
    RolledBack,
    /// Failed with `on-fail = "abort"`: the run stopped here.
    Aborted,
}

impl Action {
    /// The action in the report's words.
    pub fn label(self) -> &'static str {
        match self {
            Action::Baseline => "baseline",
            Action::Kept => "kept",
            Action::RolledBack => "rolled back",
            Action::Aborted => "aborted",
        }
    }
}

/// A gate's verdict on one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// What was done.
    pub action: Action,
    /// Whether the gate passed.
    pub passed: bool,
    /// Why, in numbers a reader can check.
    pub reason: String,
}

/// Decide on a stage from its validation metrics, the baseline's and its input's, and its max
/// logit error against its input (on the golden set). Test metrics are never an input.
pub fn decide(
    gate: Option<&GateSpec>,
    valid: &EvalMetrics,
    baseline: &EvalMetrics,
    input: &EvalMetrics,
    logit_error_vs_input: f64,
) -> Decision {
    let Some(g) = gate else {
        return Decision {
            action: Action::Kept,
            passed: true,
            reason: "no gate".into(),
        };
    };
    let reference = match g.against {
        GateReference::Baseline => baseline,
        GateReference::Previous => input,
    };
    let (failures, checks) = tolerance_lines(g, valid, reference, logit_error_vs_input);
    if failures.is_empty() {
        return Decision {
            action: Action::Kept,
            passed: true,
            reason: format!("gate passed: {}", checks.join("; ")),
        };
    }
    failed_decision(g.on_fail, &failures)
}

/// One line per tolerance of the gate, split into (failures, checks).
fn tolerance_lines(
    g: &GateSpec,
    valid: &EvalMetrics,
    reference: &EvalMetrics,
    logit_error_vs_input: f64,
) -> (Vec<String>, Vec<String>) {
    let m = g.metric;
    let (name, now, then) = (m.name(), valid.value(m), reference.value(m));
    let worse = m.worse_by(now, then);
    let (word, (abs_key, rel_key)) = (m.worsening(), worse_keys(m));
    // Accuracy and macro-F1 differences read in points; loss and perplexity as they are.
    let (scale, unit) = if m.in_points() {
        (100.0, " points")
    } else {
        (1.0, "")
    };
    // Each tolerance gives a line, filed under failures or checks.
    let (mut failures, mut checks) = (Vec::new(), Vec::new());
    let mut file = |line: String, failed: bool| {
        if failed {
            failures.push(line)
        } else {
            checks.push(line)
        }
    };
    if let Some(max) = g.max_worse {
        file(
            format!(
                "validation {name} {now:.4} vs {} {then:.4}: {word} {:.2}{unit} ({abs_key} {:.2})",
                g.against.name(),
                worse * scale,
                max * scale
            ),
            worse > max + 1e-12,
        );
    }
    if let Some(max) = g.max_relative_worse {
        let rel = if then > 0.0 { worse / then } else { 0.0 };
        file(
            format!(
                "validation {name} {now:.4} vs {} {then:.4}: relative {word} {:.2}% ({rel_key} {:.2}%)",
                g.against.name(),
                rel * 100.0,
                max * 100.0
            ),
            rel > max + 1e-12,
        );
    }
    if let Some(max) = g.max_logit_error {
        file(
            format!(
                "max |logit - input's logit| on the golden set {logit_error_vs_input:.3e} (max-logit-error {max:.1e})"
            ),
            logit_error_vs_input > max || !logit_error_vs_input.is_finite(),
        );
    }
    (failures, checks)
}

/// The failing verdict for a gate's `on-fail` policy, listing the failed tolerances.
fn failed_decision(on_fail: OnFail, failures: &[String]) -> Decision {
    let action = match on_fail {
        OnFail::Abort => Action::Aborted,
        // Kinds with a gentler retry run it before the runner sees a failure.
        OnFail::Rollback | OnFail::Retry => Action::RolledBack,
    };
    Decision {
        action,
        passed: false,
        reason: format!(
            "gate failed: {}{}",
            failures.join("; "),
            if action == Action::RolledBack {
                "; the next stage starts from the last passing model"
            } else {
                "; the run stops"
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mopt_recipe::GateMetric;

    fn m(acc: f64) -> EvalMetrics {
        EvalMetrics {
            loss: 0.5,
            accuracy: acc,
            macro_f1: acc - 0.01,
            examples: 100,
        }
    }

    fn gate(
        max_drop: Option<f64>,
        rel: Option<f64>,
        logit: Option<f64>,
        against: GateReference,
    ) -> GateSpec {
        GateSpec {
            metric: GateMetric::Accuracy,
            against,
            max_worse: max_drop,
            max_relative_worse: rel,
            max_logit_error: logit,
            on_fail: OnFail::Rollback,
        }
    }

    #[test]
    fn absolute_and_relative_drops_against_baseline_or_input() {
        let g = gate(Some(0.02), None, None, GateReference::Baseline);
        assert!(decide(Some(&g), &m(0.81), &m(0.83), &m(0.80), 0.0).passed);
        let d = decide(Some(&g), &m(0.80), &m(0.83), &m(0.80), 0.0);
        assert!(!d.passed && d.action == Action::RolledBack, "{d:?}");
        assert!(
            d.reason.contains("drop 3.00 points") && d.reason.contains("max-drop 2.00"),
            "{}",
            d.reason
        );
        // Against the input (previous stage) the same model passes: it lost nothing there.
        let p = gate(Some(0.02), None, None, GateReference::Previous);
        assert!(decide(Some(&p), &m(0.80), &m(0.83), &m(0.80), 0.0).passed);
        // 5% relative of 0.80 is 0.04.
        let r = gate(None, Some(0.05), None, GateReference::Baseline);
        assert!(decide(Some(&r), &m(0.77), &m(0.80), &m(0.80), 0.0).passed);
        assert!(!decide(Some(&r), &m(0.75), &m(0.80), &m(0.80), 0.0).passed);
    }

    #[test]
    fn perplexity_is_gated_on_its_rise() {
        // Perplexity is exp(loss): 20.0 for the reference, 25.0 and 27.0 for two candidates.
        let ppl = |p: f64| EvalMetrics {
            loss: f64::ln(p),
            ..m(0.3)
        };
        let mut g = gate(None, Some(0.3), None, GateReference::Baseline);
        g.metric = GateMetric::Perplexity;
        let kept = decide(Some(&g), &ppl(25.0), &ppl(20.0), &ppl(20.0), 0.0);
        assert!(kept.passed, "{kept:?}");
        assert!(
            kept.reason.contains(
                "validation perplexity 25.0000 vs baseline 20.0000: relative rise 25.00% (max-relative-rise 30.00%)"
            ),
            "{}",
            kept.reason
        );
        assert!(!decide(Some(&g), &ppl(27.0), &ppl(20.0), &ppl(20.0), 0.0).passed);
        // A lower perplexity than the reference is no rise at all.
        g.max_worse = Some(0.0);
        assert!(decide(Some(&g), &ppl(19.0), &ppl(20.0), &ppl(20.0), 0.0).passed);
        let d = decide(Some(&g), &ppl(20.5), &ppl(20.0), &ppl(20.0), 0.0);
        assert!(
            d.reason.contains("rise 0.50 (max-rise 0.00)"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn logit_error_gate_and_abort() {
        let mut g = gate(None, None, Some(1e-4), GateReference::Baseline);
        assert!(decide(Some(&g), &m(0.8), &m(0.8), &m(0.8), 5e-5).passed);
        assert!(!decide(Some(&g), &m(0.8), &m(0.8), &m(0.8), 2e-4).passed);
        assert!(!decide(Some(&g), &m(0.8), &m(0.8), &m(0.8), f64::NAN).passed);
        g.on_fail = OnFail::Abort;
        assert_eq!(
            decide(Some(&g), &m(0.8), &m(0.8), &m(0.8), 1.0).action,
            Action::Aborted
        );
        assert_eq!(
            decide(None, &m(0.1), &m(0.9), &m(0.9), 9.0).action,
            Action::Kept
        );
    }
}
