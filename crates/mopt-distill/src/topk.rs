//! Top-k teacher logits for outputs as wide as a vocabulary. A language model's teacher gives
//! one row of logits per token (49,152 floats, 192 KiB, for SmolLM2): cached whole for every
//! training token that is out of reach. Kept instead per row: the `k` largest logits with their
//! ids and `rest`, the log of the remaining probability mass `ln Σ_{j ∉ top-k} exp(z_j)` —
//! `8k + 4` bytes a row. The soft term then compares teacher and student over `k + 1` buckets
//! (the top-k tokens and everything else), the bucketed KL of ModelOpt's and Minitron's logit
//! caches: exact at `T = 1`; at another temperature the teacher's remaining mass is tempered as
//! if spread evenly over the `V − k` other tokens, `rest / T + (1 − 1/T)·ln(V − k)`.

use burn::prelude::*;
use burn::tensor::activation::log_softmax;

use crate::spec::SoftLoss;

/// The `k` largest values of `row` in descending order (equal values: the lower id first) with
/// their ids, and `ln Σ exp` over the other values (`-inf` when there are none).
pub fn top_k(row: &[f32], k: usize) -> (Vec<u32>, Vec<f32>, f32) {
    let k = k.min(row.len());
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let by_value = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < ids.len() && k > 0 {
        ids.select_nth_unstable_by(k - 1, by_value);
    }
    let (top, others) = ids.split_at_mut(k);
    top.sort_by(by_value);
    let max = others
        .iter()
        .map(|&j| row[j as usize])
        .fold(f32::NEG_INFINITY, f32::max);
    let rest = if max == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        let sum: f64 = others
            .iter()
            .map(|&j| ((row[j as usize] - max) as f64).exp())
            .sum();
        max + sum.ln() as f32
    };
    let values = top.iter().map(|&j| row[j as usize]).collect();
    (top.to_vec(), values, rest)
}

/// A batch of top-k teacher rows on a device.
#[derive(Debug, Clone)]
pub struct TopKRows {
    /// `[rows, k]`: the ids of the teacher's largest logits, descending.
    pub ids: Tensor<2, Int>,
    /// `[rows, k]`: those logits.
    pub logits: Tensor<2>,
    /// `[rows, 1]`: `ln Σ exp` of the teacher's other logits.
    pub rest: Tensor<2>,
    /// The full row width (classes or vocabulary) the top-k were taken from.
    pub width: usize,
}

/// The teacher's side of a batch's soft term: every logit, or the top-k of each row.
// One value a batch, moved once into the loss: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum TeacherRows {
    /// `[rows, width]`: every logit.
    Full(Tensor<2>),
    /// The `k` largest and the remaining mass of each row.
    TopK(TopKRows),
}

impl From<Tensor<2>> for TeacherRows {
    fn from(t: Tensor<2>) -> Self {
        TeacherRows::Full(t)
    }
}

impl From<TopKRows> for TeacherRows {
    fn from(t: TopKRows) -> Self {
        TeacherRows::TopK(t)
    }
}

/// The soft term against top-k teacher rows.
///
/// - `Kl`: `T² · Σ_b p_b (ln p_b − ln q_b)` over the `k + 1` buckets, mean over rows, where the
///   student's bucket probabilities `q` come from its full softmax at `T` (its remaining mass
///   is `1 − Σ_top q`, floored at 1e-12) and the teacher's `p` from its top-k logits and
///   tempered remaining mass (module docs).
/// - `Mse`: mean squared error between the student's and the teacher's logits at the teacher's
///   top-k ids (T does not apply).
///
/// # Shapes
/// - student: `[rows, width]` → `[1]`
pub fn top_k_soft_loss(
    student: Tensor<2>,
    teacher: TopKRows,
    temperature: f64,
    kind: SoftLoss,
) -> Tensor<1> {
    let [rows, width] = student.dims();
    let k = teacher.ids.dims()[1];
    assert_eq!(
        width, teacher.width,
        "student and teacher rows differ in width"
    );
    if kind == SoftLoss::Mse {
        let at_top = student.gather(1, teacher.ids);
        return (at_top - teacher.logits).square().mean();
    }
    let t = temperature as f32;
    let log_q = log_softmax(student.div_scalar(t), 1);
    let log_q_top = log_q.gather(1, teacher.ids);
    let q_rest = log_q_top.clone().exp().sum_dim(1).neg().add_scalar(1.0);
    let log_q_rest = q_rest.clamp_min(1e-12).log();
    let log_q = Tensor::cat(vec![log_q_top, log_q_rest], 1);
    let spread = if width > k {
        (1.0 - 1.0 / t) * ((width - k) as f32).ln()
    } else {
        0.0
    };
    let rest = teacher.rest.div_scalar(t).add_scalar(spread);
    let log_p = log_softmax(Tensor::cat(vec![teacher.logits.div_scalar(t), rest], 1), 1);
    // A row whose top-k covers every class has an empty bucket: 0 · ln 0 counts as 0.
    let p = log_p.clone().exp();
    let terms = p * (log_p - log_q);
    let terms = terms.clone().mask_fill(terms.is_nan(), 0.0);
    terms.sum().div_scalar(rows as f32).mul_scalar(t * t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::soft_loss;

    fn rows(v: &[Vec<f32>]) -> Tensor<2> {
        let flat: Vec<f32> = v.iter().flatten().copied().collect();
        Tensor::from_data(
            TensorData::new(flat, [v.len(), v[0].len()]),
            &Device::flex(),
        )
    }

    fn top(v: &[Vec<f32>], k: usize) -> TopKRows {
        let picked: Vec<_> = v.iter().map(|r| top_k(r, k)).collect();
        let ids: Vec<i64> = picked
            .iter()
            .flat_map(|p| p.0.iter().map(|&i| i as i64))
            .collect();
        let logits: Vec<f32> = picked.iter().flat_map(|p| p.1.clone()).collect();
        let rest: Vec<f32> = picked.iter().map(|p| p.2).collect();
        let d = Device::flex();
        TopKRows {
            ids: Tensor::from_data(TensorData::new(ids, [v.len(), k]), &d),
            logits: Tensor::from_data(TensorData::new(logits, [v.len(), k]), &d),
            rest: Tensor::from_data(TensorData::new(rest, [v.len(), 1]), &d),
            width: v[0].len(),
        }
    }

    #[test]
    fn top_k_picks_the_largest_in_order_and_sums_the_rest() {
        let row = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        let (ids, values, rest) = top_k(&row, 3);
        assert_eq!(ids, [1, 3, 4], "ties: the lower id first");
        assert_eq!(values, [3.0, 3.0, 2.0]);
        let want = (0.5f64.exp() + (-1.0f64).exp()).ln() as f32;
        assert!((rest - want).abs() < 1e-6, "{rest} vs {want}");
        let (ids, _, rest) = top_k(&row, 9);
        assert_eq!(ids.len(), 5);
        assert_eq!(rest, f32::NEG_INFINITY);
    }

    /// With every class in the top-k the bucketed KL is the full KL; at T = 1 it equals the
    /// KL between the bucket distributions computed by hand; and it is 0 for a student equal to
    /// the teacher at T = 1.
    #[test]
    fn bucketed_kl_matches_the_full_kl_and_a_hand_computation() {
        let s = vec![vec![2.0f32, -1.0, 0.5, 0.0], vec![0.1, 3.0, -2.0, 1.0]];
        let t = vec![vec![1.0f32, 0.0, -0.5, 2.0], vec![0.3, 1.0, 0.2, -1.0]];
        for temp in [1.0, 2.0, 4.0] {
            let full: f32 = soft_loss(rows(&s), rows(&t), temp, SoftLoss::Kl).into_scalar();
            let all: f32 = top_k_soft_loss(rows(&s), top(&t, 4), temp, SoftLoss::Kl).into_scalar();
            assert!((full - all).abs() < 1e-5, "T={temp}: {full} vs {all}");
        }
        // k = 2 at T = 1, by hand: buckets {top1, top2, rest} for both sides.
        let softmax = |r: &[f32]| {
            let z: f64 = r.iter().map(|&x| (x as f64).exp()).sum();
            r.iter()
                .map(|&x| (x as f64).exp() / z)
                .collect::<Vec<f64>>()
        };
        let mut want = 0.0;
        for (rs, rt) in s.iter().zip(&t) {
            let (ids, _, _) = top_k(rt, 2);
            let (ps, pt) = (softmax(rs), softmax(rt));
            let bucket = |p: &[f64]| {
                let top: Vec<f64> = ids.iter().map(|&i| p[i as usize]).collect();
                let rest = 1.0 - top.iter().sum::<f64>();
                [top[0], top[1], rest]
            };
            let (bs, bt) = (bucket(&ps), bucket(&pt));
            want += (0..3).map(|b| bt[b] * (bt[b] / bs[b]).ln()).sum::<f64>();
        }
        want /= 2.0;
        let got: f32 = top_k_soft_loss(rows(&s), top(&t, 2), 1.0, SoftLoss::Kl).into_scalar();
        assert!((got as f64 - want).abs() < 1e-5, "{got} vs {want}");
        let same: f32 = top_k_soft_loss(rows(&t), top(&t, 2), 1.0, SoftLoss::Kl).into_scalar();
        assert!(same.abs() < 1e-6, "{same}");
        // MSE at the top ids only.
        let mse: f32 = top_k_soft_loss(rows(&s), top(&t, 1), 1.0, SoftLoss::Mse).into_scalar();
        let want = ((0.0f32 - 2.0).powi(2) + (3.0f32 - 1.0).powi(2)) / 2.0;
        assert!((mse - want).abs() < 1e-6, "{mse} vs {want}");
    }
}
