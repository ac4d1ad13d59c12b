//! Several seeds of one recipe: each stage's headline metric (its family's: accuracy, perplexity) as mean and spread over the runs, and for
//! every model reported beside a stage (a distillation's hard-label twin, a pruning criterion
//! compared) the paired difference stage − reference with its 95% interval. One seed is an
//! anecdote; this is what a claim that one method beats another rests on.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::record::{write_json_atomic, Headline, ModelFacts, ReferenceRecord, StageRecord};
use crate::report::PipelineReport;
use crate::StageError;

/// Mean, sample standard deviation and count of some values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The mean.
    pub mean: f64,
    /// The sample standard deviation (n − 1); 0 for one value.
    pub std: f64,
    /// Values.
    pub n: usize,
}

impl Spread {
    /// Of `values` (at least one).
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Self {
            mean,
            std: var.sqrt(),
            n,
        }
    }

    /// The half-width of the mean's two-sided 95% interval (Student's t with n − 1 degrees
    /// of freedom); `None` for fewer than two values.
    pub fn ci95(&self) -> Option<f64> {
        (self.n > 1).then(|| t975(self.n - 1) * self.std / (self.n as f64).sqrt())
    }
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    TABLE.get(df.wrapping_sub(1)).copied().unwrap_or(1.960)
}

/// One stage over the seeds.
#[derive(Debug, Clone, Serialize)]
pub struct StageSpread {
    /// Its index in the chain (0: the baseline).
    pub index: usize,
    /// Its name.
    pub name: String,
    /// The headline metric on validation.
    pub valid: Spread,
    /// The same on test.
    pub test: Spread,
    /// The models reported beside it, paired with it seed by seed (a hard-label twin with the
    /// distilled model, whichever of the two was handed on).
    pub references: Vec<PairedReference>,
    /// Seed by seed, which of the stage's model and its twin was handed on (`facts.kept`:
    /// `distilled` or `hard-label twin`); empty for a stage without a twin.
    pub kept: Vec<String>,
}

/// A reference model over the seeds, and the stage's paired difference against it.
#[derive(Debug, Clone, Serialize)]
pub struct PairedReference {
    /// Its name (e.g. the hard-label twin).
    pub name: String,
    /// Its test headline metric.
    pub test: Spread,
    /// Stage − reference on the test metric, seed by seed.
    pub test_difference: Spread,
    /// Stage − reference on the validation metric.
    pub valid_difference: Spread,
}

/// The runs of one recipe under several seeds.
#[derive(Debug, Clone, Serialize)]
pub struct SeedSummary {
    /// The headline metric (the runs' family's).
    pub metric: String,
    /// The seeds, in run order.
    pub seeds: Vec<u64>,
    /// The run folders.
    pub runs: Vec<String>,
    /// Every stage that ran in every seed's run.
    pub stages: Vec<StageSpread>,
}

/// Summarize `runs` (one report a seed, same recipe).
pub fn summarize(runs: &[(u64, PipelineReport)]) -> SeedSummary {
    let h = Headline::named(&runs[0].1.metric);
    let stages = runs[0]
        .1
        .stages
        .iter()
        .filter_map(|st| {
            let same = in_every(runs.iter().map(|(_, r)| &r.stages), |s: &StageRecord| {
                s.index == st.index && s.name == st.name
            })?;
            Some(stage_spread(h, st, &same))
        })
        .collect();
    SeedSummary {
        metric: h.0.name().into(),
        seeds: runs.iter().map(|(s, _)| *s).collect(),
        runs: runs.iter().map(|(_, r)| r.run_dir.clone()).collect(),
        stages,
    }
}

/// The item `matches` picks from each of `lists`, when every list has one.
fn in_every<'a, T: 'a>(
    lists: impl Iterator<Item = &'a Vec<T>>,
    matches: impl Fn(&T) -> bool,
) -> Option<Vec<&'a T>> {
    lists.map(|l| l.iter().find(|x| matches(x))).collect()
}

/// The spread of `same` (one stage, one record a seed) and of its references, paired.
fn stage_spread(h: Headline, st: &StageRecord, same: &[&StageRecord]) -> StageSpread {
    let spread = |f: &dyn Fn(&ModelFacts) -> f64| {
        Spread::of(&same.iter().map(|s| f(&s.model)).collect::<Vec<_>>())
    };
    // The distilled model of a seed's stage: its output, or the reference it was handed over
    // for when its twin was better on validation.
    fn distilled(s: &StageRecord) -> &ModelFacts {
        let handed = format!("{} (distilled)", s.name);
        s.references
            .iter()
            .find(|x| x.name == handed)
            .map_or(&s.model, |x| &x.model)
    }
    let references = st
        .references
        .iter()
        .filter(|r| !r.name.ends_with(" (distilled)"))
        .filter_map(|reference| {
            let refs = in_every(same.iter().map(|s| &s.references), |x: &ReferenceRecord| {
                x.name == reference.name
            })?;
            let each = |f: &dyn Fn(&ModelFacts, &ModelFacts) -> f64| {
                let v: Vec<f64> = same
                    .iter()
                    .zip(&refs)
                    .map(|(s, r)| match reference.twin {
                        true => f(distilled(s), &r.model),
                        false => f(&s.model, &r.model),
                    })
                    .collect();
                Spread::of(&v)
            };
            Some(PairedReference {
                name: reference.name.clone(),
                test: each(&|_, r| h.of(&r.test)),
                test_difference: each(&|s, r| h.of(&s.test) - h.of(&r.test)),
                valid_difference: each(&|s, r| h.of(&s.valid) - h.of(&r.valid)),
            })
        })
        .collect();
    StageSpread {
        index: st.index,
        name: st.name.clone(),
        valid: spread(&|m| h.of(&m.valid)),
        test: spread(&|m| h.of(&m.test)),
        references,
        kept: same
            .iter()
            .filter_map(|s| s.facts.get("kept").and_then(|k| k.as_str()))
            .map(str::to_string)
            .collect(),
    }
}

/// `summary.md`'s text.
pub fn markdown(s: &SeedSummary) -> String {
    let h = Headline::named(&s.metric);
    let pct = |x: &Spread| h.spread(x.mean, x.std);
    let mut out = format!(
        "# {} seeds: {:?}\n\nMean ± sample standard deviation over the runs ({}).\n\n",
        s.seeds.len(),
        s.seeds,
        s.runs.join(", ")
    );
    let name = h.0.name();
    let _ = writeln!(
        out,
        "| stage | validation {name} | test {name} |\n|---|---|---|"
    );
    for st in &s.stages {
        let _ = writeln!(
            out,
            "| {} {} | {} | {} |",
            st.index,
            st.name,
            pct(&st.valid),
            pct(&st.test)
        );
    }
    for st in s.stages.iter().filter(|st| !st.kept.is_empty()) {
        let twin = st.kept.iter().filter(|k| *k == "hard-label twin").count();
        let _ = writeln!(
            out,
            "\n`{}` hands on the better of its distilled model and its hard-label twin on validation: the distilled model in {} of {} seeds, the twin in {twin}.",
            st.name,
            st.kept.len() - twin,
            st.kept.len()
        );
    }
    let paired: Vec<_> = s
        .stages
        .iter()
        .flat_map(|st| st.references.iter().map(move |r| (st, r)))
        .collect();
    if !paired.is_empty() {
        out.push_str(
            "\nPaired differences, stage − reference, seed by seed (a hard-label twin: the distilled model − the twin, whichever was handed on; 95% interval: Student's t):\n\n\
             | stage | reference | reference test | test difference | 95% interval | valid difference |\n|---|---|---|---|---|---|\n",
        );
        for (st, r) in paired {
            let d = &r.test_difference;
            let ci = d.ci95().map_or("n/a (one seed)".to_string(), |w| {
                h.interval(d.mean - w, d.mean + w)
            });
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {ci} | {} |",
                st.name,
                r.name,
                pct(&r.test),
                h.spread_delta(d.mean, d.std),
                h.spread_delta(r.valid_difference.mean, r.valid_difference.std)
            );
        }
    }
    out
}

/// Write `summary.md` and `summary.json` into `dir`.
pub fn write(dir: &Path, s: &SeedSummary) -> Result<(), StageError> {
    std::fs::create_dir_all(dir).map_err(|e| StageError::io(dir, e))?;
    write_json_atomic(&dir.join("summary.json"), s)?;
    let md = dir.join("summary.md");
    std::fs::write(&md, markdown(s)).map_err(|e| StageError::io(&md, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_interval() {
        let s = Spread::of(&[0.30, 0.45, 0.24]);
        assert!((s.mean - 0.33).abs() < 1e-12);
        // sample std of (−0.03, 0.12, −0.09): sqrt((0.0009 + 0.0144 + 0.0081) / 2)
        assert!((s.std - (0.0234f64 / 2.0).sqrt()).abs() < 1e-12);
        let h = s.ci95().unwrap();
        assert!((h - 4.303 * s.std / 3f64.sqrt()).abs() < 1e-12);
        assert_eq!(Spread::of(&[0.5]).ci95(), None);
        assert_eq!(t975(1000), 1.960);
    }

    #[test]
    fn the_summary_speaks_of_the_headline_metric() {
        let spread = |v: &[f64]| Spread::of(v);
        let summary = |metric: &str| SeedSummary {
            metric: metric.into(),
            seeds: vec![1, 2],
            runs: vec!["a".into(), "b".into()],
            stages: vec![StageSpread {
                index: 1,
                name: "distill".into(),
                valid: spread(&[0.90, 0.92]),
                test: spread(&[0.89, 0.91]),
                references: vec![PairedReference {
                    name: "twin".into(),
                    test: spread(&[0.88, 0.90]),
                    test_difference: spread(&[0.01, 0.01]),
                    valid_difference: spread(&[0.02, 0.0]),
                }],
                kept: vec!["distilled".into(), "hard-label twin".into()],
            }],
        };
        let acc = markdown(&summary("accuracy"));
        assert!(
            acc.contains("`distill` hands on the better of its distilled model and its hard-label twin on validation: the distilled model in 1 of 2 seeds, the twin in 1."),
            "{acc}"
        );
        assert!(
            acc.contains("| stage | validation accuracy | test accuracy |"),
            "{acc}"
        );
        assert!(
            acc.contains("| 1 distill | 91.00 ± 1.41% | 90.00 ± 1.41% |"),
            "{acc}"
        );
        assert!(
            acc.contains("| distill | twin | 89.00 ± 1.41% | +1.00 ± 0.00 pt | [+1.00, +1.00] pt | +1.00 ± 1.41 pt |"),
            "{acc}"
        );
        // Perplexity is shown as it is, lower being better.
        let mut p = summary("perplexity");
        p.stages[0].valid = spread(&[21.0, 23.0]);
        p.stages[0].references[0].test_difference = spread(&[-1.5, -0.5]);
        let ppl = markdown(&p);
        assert!(
            ppl.contains("| stage | validation perplexity | test perplexity |"),
            "{ppl}"
        );
        assert!(ppl.contains("| 1 distill | 22.000 ± 1.414 |"), "{ppl}");
        assert!(ppl.contains("| -1.000 ± 0.707 |"), "{ppl}");
    }
}
