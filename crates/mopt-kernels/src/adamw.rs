//! AdamW as one fused pass per parameter tensor, behind Burn's `Optimizer` trait, so Burn's
//! `ModuleOptimizer` (parameter groups, state records, resume) drives it unchanged.
//!
//! Burn's `AdamW` runs about a dozen tensor ops per parameter (each a full pass and an
//! allocation); this reads the parameter, the gradient and both moments once and writes
//! them back in place where it owns them. The formula and the state (`AdamWState`, with
//! Burn's `AdaptiveMomentumState`) are Burn's, so the states are interchangeable: a
//! checkpointed optimizer state resumes under either implementation. Off Flex/f32, or with
//! fused kernels off, each step is Burn's own `AdamW`.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, ModuleOptimizer, Optimizer,
};
use burn::prelude::*;
use burn::tensor::DType;

use crate::cpu::{self, AdamWStep};

static FUSED_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Parameter tensors updated by the fused kernel so far in this process (the rest went
/// through Burn's `AdamW`).
pub fn fused_steps() -> u64 {
    FUSED_STEPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// AdamW hyper-parameters.
#[derive(Clone)]
pub struct FusedAdamW {
    /// Decay of the first moment.
    pub beta_1: f32,
    /// Decay of the second moment.
    pub beta_2: f32,
    /// Added to the second moment's square root.
    pub epsilon: f32,
    /// Decoupled weight decay (scaled by the learning rate).
    pub weight_decay: f32,
    /// Burn's implementation, used where the fused one does not apply.
    plain: AdamW,
}

impl std::fmt::Debug for FusedAdamW {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedAdamW")
            .field("beta_1", &self.beta_1)
            .field("beta_2", &self.beta_2)
            .field("epsilon", &self.epsilon)
            .field("weight_decay", &self.weight_decay)
            .finish()
    }
}

impl FusedAdamW {
    /// AdamW with these hyper-parameters (Burn's `AdamWConfig` for the parameters the fused step does not take).
    pub fn new(beta_1: f32, beta_2: f32, epsilon: f32, weight_decay: f32) -> Self {
        let plain = AdamWConfig::new()
            .with_beta_1(beta_1)
            .with_beta_2(beta_2)
            .with_epsilon(epsilon)
            .with_weight_decay(weight_decay)
            .build();
        Self {
            beta_1,
            beta_2,
            epsilon,
            weight_decay,
            plain,
        }
    }

    /// A module optimizer (Burn's `ModuleOptimizer`) running this AdamW on every parameter.
    pub fn init(self) -> ModuleOptimizer {
        ModuleOptimizer::from(self)
    }
}

fn flex(t: Tensor<1>) -> Option<FlexTensor> {
    t.try_into_primitive::<Flex>().ok()
}

/// A contiguous, uniquely owned Flex tensor (copied only when shared or strided), so that its
/// storage can be updated in place.
fn writable(t: FlexTensor) -> FlexTensor {
    if t.layout().is_contiguous() && t.layout().start_offset() == 0 && t.is_unique() {
        t
    } else {
        t.to_contiguous()
    }
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdamWState<D>>,
    ) -> (Tensor<D>, Option<AdamWState<D>>) {
        let fusable = crate::enabled()
            && tensor.dtype() == DType::F32
            && grad.dtype() == DType::F32
            && crate::is_fused(&tensor)
            && !crate::is_autodiff(&tensor)
            && state
                .as_ref()
                .is_none_or(|s| s.momentum.max_moment_2.is_none());
        if !fusable {
            return self.plain.step(lr, tensor, grad, state);
        }
        let shape = tensor.shape();
        let n = shape.num_elements();
        let device = tensor.device();
        let flat = |t: Tensor<D>| flex(t.reshape([n])).map(writable);
        let (time, m, v) = match state {
            Some(s) => (
                s.momentum.time + 1,
                s.momentum.moment_1,
                s.momentum.moment_2,
            ),
            None => {
                let zeros = || Tensor::<D>::zeros(shape.clone(), &device);
                (1, zeros(), zeros())
            }
        };
        let (Some(mut p), Some(g), Some(mut m), Some(mut v)) =
            (flat(tensor), flat(grad), flat(m), flat(v))
        else {
            unreachable!("parameter, gradient and moments are Flex f32 tensors on one device");
        };
        let t = time as i32;
        let step = AdamWStep {
            lr: lr as f32,
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            decay: (1.0 - lr * self.weight_decay as f64) as f32,
            correction_1: 1.0 - self.beta_1.powi(t),
            correction_2: 1.0 - self.beta_2.powi(t),
        };
        cpu::adamw(
            p.storage_mut::<f32>(),
            g.as_slice::<f32>().expect("contiguous gradient"),
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
            step,
        );
        FUSED_STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let back = |x: FlexTensor| -> Tensor<D> {
            Tensor::<1>::from_primitive::<Flex>(x).reshape(shape.clone())
        };
        let state = AdamWState::new(AdaptiveMomentumState::new(time, back(m), back(v)));
        (back(p), Some(state))
    }

    fn to_device<const D: usize>(mut state: AdamWState<D>, device: &Device) -> AdamWState<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}
