//! Distillation with feature-map matches for any [`FeatureMaps`] model (CNNs): the KD objective
//! on logits plus, per matched pair of maps, FitNets' MSE between the student's map (through a
//! learned 1×1 convolution where the widths differ) and the teacher's, or attention transfer
//! (Zagoruyko & Komodakis, 2017): the squared L2 distance between the maps' spatial attention
//! `a(x) = Σ_c x_c²`, flattened and L2-normalised, averaged over the batch. The teacher runs
//! live on the inference device (feature maps are too large to cache for a whole data set).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn::prelude::*;
use mopt_core::{Examples, FeatureMaps, Labeled};
use mopt_train::trainer::{Parts, Task};

use crate::kd::{kd_loss, with_extra_term, ExtraTerm, KdSettings};

/// How a pair of feature maps is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapLoss {
    /// MSE between the (projected) student map and the teacher's (FitNets).
    Mse,
    /// Squared distance between normalised spatial attention maps (attention transfer).
    Attention,
}

/// One matched pair of feature maps.
#[derive(Debug, Clone, PartialEq)]
pub struct MapMatch {
    /// The student's map (index into [`FeatureMaps::forward_maps`]).
    pub student: usize,
    /// The teacher's map.
    pub teacher: usize,
    /// How they are compared.
    pub loss: MapLoss,
    /// The term's weight in the objective.
    pub weight: f64,
    /// Last epoch (1-based) in which the match is on; `None`: every epoch.
    pub until_epoch: Option<usize>,
    /// The name its term is logged under (`hidden_mse_1`).
    pub name: &'static str,
    /// The recipe asks for a learned projection (`projection = true`; one is made anyway where
    /// an MSE match's widths differ).
    pub projection: bool,
}

/// One match's widths for [`MapStudent::new`]: the student's channels, the teacher's, the
/// comparison and whether the recipe asks for a projection.
pub type MapWidths = (usize, usize, MapLoss, bool);

/// The student and the 1×1-convolution projections its matches train (one slot a match; `None`
/// where none is needed). Only the student is checkpointed.
#[derive(Module, Debug)]
pub struct MapStudent<M> {
    /// The student being distilled.
    pub student: M,
    /// One projection slot a match, student width → teacher width.
    pub projections: Vec<Option<Conv2d>>,
}

impl<M> MapStudent<M> {
    /// `student` with a projection for every MSE match whose widths (one [`MapWidths`] a match)
    /// differ or that asks for one, on `device`.
    pub fn new(student: M, widths: &[MapWidths], device: &Device) -> Self {
        let projections = widths
            .iter()
            .map(|&(s, t, loss, asked)| {
                (loss == MapLoss::Mse && (s != t || asked)).then(|| {
                    Conv2dConfig::new([s, t], [1, 1])
                        .with_bias(false)
                        .init(device)
                })
            })
            .collect();
        Self {
            student,
            projections,
        }
    }
}

/// The normalised spatial attention of a feature map.
///
/// # Shapes
/// - x: `[batch, channels, height, width]`; output: `[batch, height·width]`
pub fn spatial_attention(x: Tensor<4>) -> Tensor<2> {
    let [b, c, h, w] = x.dims();
    let a = x
        .powi_scalar(2)
        .reshape([b, c, h * w])
        .sum_dim(1)
        .reshape([b, h * w]);
    let norm = a.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    a / norm
}

/// The term of one match.
///
/// # Shapes
/// - s, t: `[batch, channels, height, width]` (same height and width; same channels for MSE
///   after the projection); output: `[1]`
fn map_loss(s: Tensor<4>, t: Tensor<4>, loss: MapLoss, projection: Option<&Conv2d>) -> Tensor<1> {
    match loss {
        MapLoss::Mse => {
            let s = match projection {
                Some(p) => mopt_kernels::conv2d(s, p.weight.val(), 1, 0),
                None => s,
            };
            (s - t).powi_scalar(2).mean()
        }
        MapLoss::Attention => {
            let b = s.dims()[0];
            let d = spatial_attention(s) - spatial_attention(t);
            d.powi_scalar(2).sum().div_scalar(b as f32)
        }
    }
}

/// Distillation of a [`FeatureMaps`] student from a live teacher of the same family: KD on
/// logits plus the feature-map matches.
pub struct MapKdTask<'a, M: FeatureMaps> {
    settings: KdSettings,
    matches: Vec<MapMatch>,
    teacher: M,
    /// The training split, batched again on the teacher's device.
    train: &'a dyn Examples<Batch = M::Batch>,
    teacher_device: Device,
    ce: CrossEntropyLoss,
    epoch: usize,
    extra: Option<ExtraTerm>,
}

impl<'a, M: FeatureMaps> MapKdTask<'a, M> {
    /// `teacher` (in eval mode, on `teacher_device`) over the training split `train`, the
    /// logits objective `settings` and `matches`; `device` is the training device.
    pub fn new(
        settings: KdSettings,
        matches: Vec<MapMatch>,
        (teacher, teacher_device): (M, Device),
        train: &'a dyn Examples<Batch = M::Batch>,
        device: &Device,
    ) -> Self {
        Self {
            settings,
            matches,
            teacher,
            train,
            teacher_device,
            ce: CrossEntropyLossConfig::new().init(device),
            epoch: 1,
            extra: None,
        }
    }

    /// Add a loss term of the caller's ([`ExtraTerm`]).
    pub fn with_extra(mut self, term: Option<ExtraTerm>) -> Self {
        self.extra = term;
        self
    }
}

/// `t` (on the teacher's device) as a constant on `device`.
fn to<const D: usize>(t: Tensor<D>, device: &Device) -> Tensor<D> {
    Tensor::from_data(t.into_data(), device)
}

impl<M: FeatureMaps<Batch: Labeled>> Task for MapKdTask<'_, M> {
    type Model = MapStudent<M>;
    type Classifier = M;

    fn loss(
        &mut self,
        model: &MapStudent<M>,
        b: &M::Batch,
        indices: &[usize],
        progress: f64,
    ) -> (Tensor<1>, Parts) {
        let (s_maps, logits) = model.student.forward_maps(b);
        let device = logits.device();
        let ce = self.ce.forward(logits.clone(), b.labels());
        let (t_maps, t_logits) = self
            .teacher
            .forward_maps(&self.train.batch(indices, &self.teacher_device));
        let (mut loss, mut parts) = kd_loss(
            ce,
            logits.clone(),
            to(t_logits, &device),
            &self.settings,
            progress,
        );
        for (i, m) in self.matches.iter().enumerate() {
            if m.until_epoch.is_some_and(|e| self.epoch > e) {
                continue;
            }
            let t = to(t_maps[m.teacher].clone(), &device);
            let projection = model.projections[i].as_ref();
            let l = map_loss(s_maps[m.student].clone(), t, m.loss, projection);
            let v: f32 = l.clone().into_scalar();
            parts.push((m.name, v as f64));
            loss = loss + l.mul_scalar(m.weight as f32);
        }
        with_extra_term((loss, parts), self.extra.as_ref(), logits, b)
    }

    fn classifier<'m>(&self, model: &'m MapStudent<M>) -> &'m M {
        &model.student
    }

    fn begin_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// Attention maps sum the squared channels at each position and have unit norm; the
    /// attention term is 0 for maps that differ only by a positive scale and channel order,
    /// and the MSE term is the plain mean of squared differences.
    #[test]
    fn attention_and_mse_terms_on_hand_values() {
        let dev = Device::flex();
        // One image, two channels, 1×2 positions: position energies 1+4 = 5 and 9+16 = 25.
        let x = Tensor::<4>::from_data([[[[1.0f32, 3.0]], [[2.0, 4.0]]]], &dev);
        let a = values(spatial_attention(x.clone()));
        let n = (5.0f32 * 5.0 + 25.0 * 25.0).sqrt();
        assert!(
            (a[0] - 5.0 / n).abs() < 1e-6 && (a[1] - 25.0 / n).abs() < 1e-6,
            "{a:?}"
        );
        let scaled = Tensor::<4>::from_data([[[[4.0f32, 8.0]], [[2.0, 6.0]]]], &dev);
        let at = values(map_loss(x.clone(), scaled, MapLoss::Attention, None))[0];
        assert!(at < 1e-10, "{at}");
        let other = Tensor::<4>::from_data([[[[3.0f32, 1.0]], [[4.0, 2.0]]]], &dev);
        assert!(values(map_loss(x.clone(), other.clone(), MapLoss::Attention, None))[0] > 0.1);
        let mse = values(map_loss(x, other, MapLoss::Mse, None))[0];
        assert!((mse - (4.0 + 4.0 + 4.0 + 4.0) / 4.0).abs() < 1e-6, "{mse}");
    }

    /// A projection is created exactly where an MSE match's widths differ or it asks for one.
    #[test]
    fn projections_only_where_widths_differ_or_asked() {
        let m = MapStudent::new(
            (),
            &[
                (8, 16, MapLoss::Mse, false),
                (16, 16, MapLoss::Mse, false),
                (8, 32, MapLoss::Attention, false),
                (16, 16, MapLoss::Mse, true),
            ],
            &Device::flex(),
        );
        let shapes: Vec<Option<[usize; 4]>> = m
            .projections
            .iter()
            .map(|p| p.as_ref().map(|c| c.weight.val().dims()))
            .collect();
        assert_eq!(
            shapes,
            vec![Some([16, 8, 1, 1]), None, None, Some([16, 16, 1, 1])]
        );
    }
}
