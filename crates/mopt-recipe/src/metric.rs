//! The validation metrics a recipe can name (`best-metric`, a gate's `metric`), each with its
//! direction: classification's accuracy and macro-F1 (higher is better), and the loss and
//! perplexity of any task (lower is better; perplexity is `exp` of the mean cross-entropy per
//! predicted row: per example for a classifier, per token for a language model).

/// A validation metric, by name and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Share of correct predictions (higher is better).
    Accuracy,
    /// Mean F1 over the classes (higher is better).
    MacroF1,
    /// Mean cross-entropy (lower is better).
    Loss,
    /// `exp` of the mean cross-entropy (lower is better).
    Perplexity,
}

impl Metric {
    /// Every metric, in the order messages list them.
    pub const ALL: [Metric; 4] = [
        Metric::Accuracy,
        Metric::MacroF1,
        Metric::Loss,
        Metric::Perplexity,
    ];

    /// The metric's recipe name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::MacroF1 => "macro-f1",
            Metric::Loss => "loss",
            Metric::Perplexity => "perplexity",
        }
    }

    /// The metric a recipe names (`None` for an unknown name).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The names, as an error's fix lists them: `` `accuracy`, `macro-f1`, `loss` or `perplexity` ``.
    pub fn listed() -> String {
        let names: Vec<String> = Self::ALL
            .iter()
            .map(|m| format!("`{}`", m.name()))
            .collect();
        let (last, rest) = names.split_last().expect("metrics");
        format!("{} or {last}", rest.join(", "))
    }

    /// Whether a larger value is better.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Accuracy | Metric::MacroF1)
    }

    /// How much worse `now` is than `then` (negative: better).
    pub fn worse_by(self, now: f64, then: f64) -> f64 {
        if self.higher_is_better() {
            then - now
        } else {
            now - then
        }
    }

    /// Whether `now` is strictly better than `then`.
    pub fn better(self, now: f64, then: f64) -> bool {
        self.worse_by(now, then) < 0.0
    }

    /// Whether differences are shown in points (×100: accuracy, macro-F1) or as they are.
    pub fn in_points(self) -> bool {
        self.higher_is_better()
    }

    /// The word for getting worse: `drop` (higher is better) or `rise`.
    pub fn worsening(self) -> &'static str {
        if self.higher_is_better() {
            "drop"
        } else {
            "rise"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direction_decides_better_and_worse() {
        assert!(Metric::Accuracy.better(0.91, 0.90));
        assert!(!Metric::Perplexity.better(21.0, 20.0));
        assert!(Metric::Loss.better(0.4, 0.5));
        assert!((Metric::Accuracy.worse_by(0.88, 0.90) - 0.02).abs() < 1e-12);
        assert!((Metric::Perplexity.worse_by(23.0, 20.0) - 3.0).abs() < 1e-12);
        for m in Metric::ALL {
            assert_eq!(Metric::from_name(m.name()), Some(m));
        }
        assert_eq!(Metric::from_name("f1"), None);
        assert_eq!(
            Metric::listed(),
            "`accuracy`, `macro-f1`, `loss` or `perplexity`"
        );
    }
}
