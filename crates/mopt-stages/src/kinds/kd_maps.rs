//! A distill stage's `[[stage.match]]` blocks on feature maps ([`FeatureMaps`] models: CNNs):
//! `feature = "hidden"` compares maps with MSE (FitNets; `projection = true` learns a 1×1
//! convolution where the widths differ), `feature = "attention"` with `loss = "mse"` compares
//! their spatial attention (attention transfer). Pairs index the family's maps from 0 (a
//! ResNet: map 0 is the stem's output, map `s` stage `s`'s; a plain CNN: map `b` is block `b`'s);
//! `layers = "uniform"` pairs the student's map `i ≥ 1` with the teacher's `round(i·Lt/Ls)`.

use mopt_core::FeatureMaps;
use mopt_distill::features::{MapLoss, MapMatch};
use mopt_distill::matching::layer_pairs;
use mopt_distill::spec::{Feature, HeadPolicy, MatchLoss, MatchSpec, Tokens};
use mopt_recipe::{RecipeError, Scope};

use crate::error::StageError;
use crate::kinds::distill::DistillStage;

/// Log names of the matched pairs, in order.
const NAMES: [&str; 12] = [
    "map1", "map2", "map3", "map4", "map5", "map6", "map7", "map8", "map9", "map10", "map11",
    "map12",
];

/// The stage's matches resolved against the teacher's and the student's shapes: every pair
/// in range, of the same spatial size, and of the same width or projected.
pub fn resolve<M: FeatureMaps>(
    stage: &DistillStage,
    teacher: &M::Config,
    student: &M::Config,
) -> Result<Vec<MapMatch>, StageError> {
    let (ts, ss) = (M::feature_shapes(teacher), M::feature_shapes(student));
    let cx = &stage.scope;
    let mut out = Vec::new();
    for m in &stage.spec.matches {
        let loss = map_loss(cx, m)?;
        let pairs = layer_pairs(
            cx,
            m,
            ss.len().saturating_sub(1),
            ts.len().saturating_sub(1),
        )?;
        if pairs.is_empty() {
            return Err(bad(
                cx,
                m,
                "layers",
                "it pairs no maps".into(),
                "give explicit [student, teacher] map pairs, e.g. [[0, 0]]",
            ));
        }
        for (s, t) in pairs {
            let (a, b) = (ss[s], ts[t]);
            if a[1..] != b[1..] {
                return Err(bad(cx, m, "layers", format!("the student's map {s} is {}×{}, the teacher's map {t} {}×{}", a[1], a[2], b[1], b[2]), "pair maps of the same spatial size (map 0 is the stem's output, map s stage s's)"));
            }
            if loss == MapLoss::Mse && a[0] != b[0] && !m.projection {
                return Err(bad(cx, m, "projection", format!("the student's map {s} has {} channels, the teacher's map {t} {}", a[0], b[0]), "set projection = true (a learned 1×1 convolution), or use feature = \"attention\" (attention transfer needs none)"));
            }
            let name = NAMES.get(out.len()).ok_or_else(|| {
                bad(
                    cx,
                    m,
                    "layers",
                    "more than 12 matched pairs".into(),
                    "match fewer maps",
                )
            })?;
            out.push(MapMatch {
                student: s,
                teacher: t,
                loss,
                weight: m.weight,
                until_epoch: m.until_epoch,
                name,
                projection: m.projection,
            });
        }
    }
    Ok(out)
}

/// The comparison a match asks for, where it applies to feature maps.
fn map_loss(cx: &Scope, m: &MatchSpec) -> Result<MapLoss, StageError> {
    match (m.feature, m.loss, m.tokens) {
        (_, _, Tokens::First) => Err(bad(cx, m, "tokens", "feature maps have no tokens".into(), "remove `tokens`")),
        _ if m.heads == HeadPolicy::Mean => Err(bad(cx, m, "heads", "feature maps have no attention heads (attention transfer pools channels)".into(), "remove `heads`")),
        (Feature::Hidden, MatchLoss::Mse, _) => Ok(MapLoss::Mse),
        (Feature::AttentionProbs, MatchLoss::Mse, _) => Ok(MapLoss::Attention),
        (Feature::AttentionProbs, _, _) => Err(bad(cx, m, "loss", "attention on feature maps is attention transfer".into(), "use loss = \"mse\"")),
        (f, l, _) => Err(bad(cx, m, "feature", format!("{f:?} with {l:?} does not apply to feature maps"), "use feature = \"hidden\" with loss = \"mse\" (FitNets) or feature = \"attention\" with loss = \"mse\" (attention transfer)")),
    }
}

fn bad(cx: &Scope, m: &MatchSpec, key: &str, what: String, fix: &str) -> StageError {
    let e: RecipeError = cx.err(
        &format!("match.{key}"),
        format!("match {}: {what}", m.index),
        fix,
    );
    mopt_train::TrainError::from(e).into()
}

/// The plan's line on the matches.
pub fn describe(matches: &[MapMatch]) -> String {
    let pairs: Vec<String> = matches
        .iter()
        .map(|m| {
            format!(
                "{} student map {} ~ teacher map {} (weight {}{})",
                match m.loss {
                    MapLoss::Mse => "MSE",
                    MapLoss::Attention => "attention transfer",
                },
                m.student,
                m.teacher,
                m.weight,
                m.until_epoch
                    .map_or(String::new(), |e| format!(", until epoch {e}"))
            )
        })
        .collect();
    format!("feature-map matches (teacher live): {}", pairs.join("; "))
}
