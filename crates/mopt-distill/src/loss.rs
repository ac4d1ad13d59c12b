//! Distillation losses on logits.

use crate::spec::SoftLoss;
use burn::prelude::*;
use burn::tensor::activation::{log_softmax, softmax};

/// The soft (teacher) term.
///
/// - `Kl`: `T² · KL(softmax(t/T) ‖ softmax(s/T))`, summed over classes, mean over the batch. The T²
///   keeps gradient magnitudes comparable across temperatures (Hinton et al.).
/// - `Mse`: mean squared error between raw logits (T does not apply).
///
/// # Shapes
/// - student, teacher: `[batch, classes]` → `[1]`
pub fn soft_loss(
    student: Tensor<2>,
    teacher: Tensor<2>,
    temperature: f64,
    kind: SoftLoss,
) -> Tensor<1> {
    match kind {
        SoftLoss::Kl => {
            let [batch, _] = student.dims();
            let t = temperature as f32;
            let log_ps = log_softmax(student.div_scalar(t), 1);
            let log_pt = log_softmax(teacher.clone().div_scalar(t), 1);
            let pt = softmax(teacher.div_scalar(t), 1);
            (pt * (log_pt - log_ps))
                .sum()
                .div_scalar(batch as f32)
                .mul_scalar(t * t)
        }
        SoftLoss::Mse => (student - teacher).square().mean(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t2(v: [[f32; 3]; 2]) -> Tensor<2> {
        Tensor::from_floats(v, &Device::flex())
    }

    #[test]
    fn kd_is_zero_when_student_equals_teacher_for_any_temperature() {
        let logits = [[2.0, -1.0, 0.5], [0.1, 3.0, -2.0]];
        for t in [0.5, 1.0, 2.0, 4.0, 8.0] {
            let l: f32 = soft_loss(t2(logits), t2(logits), t, SoftLoss::Kl).into_scalar();
            assert!(l.abs() < 1e-6, "T={t}: {l}");
        }
        let l: f32 = soft_loss(t2(logits), t2(logits), 4.0, SoftLoss::Mse).into_scalar();
        assert!(l.abs() < 1e-12);
    }

    #[test]
    fn kd_equals_t_squared_times_kl() {
        let s = [[2.0f32, -1.0, 0.5], [0.1, 3.0, -2.0]];
        let t = [[1.0f32, 0.0, -0.5], [0.3, 1.0, 0.2]];
        let kl = |temp: f64| -> f64 {
            let sm = |row: &[f32; 3]| {
                let e: Vec<f64> = row.iter().map(|&x| (x as f64 / temp).exp()).collect();
                let z: f64 = e.iter().sum();
                e.into_iter().map(|v| v / z).collect::<Vec<_>>()
            };
            let mut total = 0.0;
            for (rs, rt) in s.iter().zip(&t) {
                let (ps, pt) = (sm(rs), sm(rt));
                total += pt
                    .iter()
                    .zip(&ps)
                    .map(|(a, b)| a * (a / b).ln())
                    .sum::<f64>();
            }
            total / 2.0
        };
        for temp in [1.0, 2.0, 4.0] {
            let got: f32 = soft_loss(t2(s), t2(t), temp, SoftLoss::Kl).into_scalar();
            let want = temp * temp * kl(temp);
            assert!(
                (got as f64 - want).abs() < 1e-5,
                "T={temp}: {got} vs {want}"
            );
        }
        // MSE: ((1)^2+(1)^2+(1)^2+(0.2)^2+(2)^2+(2.2)^2)/6
        let got: f32 = soft_loss(t2(s), t2(t), 1.0, SoftLoss::Mse).into_scalar();
        let want = (1.0 + 1.0 + 1.0 + 0.04 + 4.0 + 4.84) / 6.0;
        assert!((got - want).abs() < 1e-5);
    }
}
