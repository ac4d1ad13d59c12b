//! ggml tensor types, half-precision conversions, and (de)quantization computed exactly as ggml's
//! reference C code does (`ggml-quants.c`: `dequantize_row_*`, `quantize_row_q8_0_ref`).
//!
//! Block layouts (little-endian, `d` and `m` are IEEE half floats):
//!
//! | type | elements a block | bytes a block | layout | value |
//! |---|---|---|---|---|
//! | `F32` | 1 | 4 | `f32` | `x` |
//! | `F16` | 1 | 2 | `f16` | `x` |
//! | `BF16` | 1 | 2 | `bf16` | `x` |
//! | `Q8_0` | 32 | 34 | `d`, `i8 q[32]` | `d·q[j]` |
//! | `Q4_0` | 32 | 18 | `d`, `u8 qs[16]` | `d·(q−8)` |
//! | `Q4_1` | 32 | 20 | `d`, `m`, `u8 qs[16]` | `d·q + m` |
//!
//! In the 4-bit types element `j < 16` of a block is the low nibble of `qs[j]` and element `j + 16`
//! its high nibble.

use std::fmt;

/// A ggml tensor type, by its id in the file (`enum ggml_type`). Ids this crate does not know are
/// kept as they are (the tensor can be listed, not read).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// `(id, name, elements a block, bytes a block)` for every type ggml defines (ids 4, 5 and 31-33,
/// 36-38 were removed from ggml). Q8_1 is 36 bytes as in ggml (`gguf-py` says 40, a stale value).
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// 32-bit float.
    pub const F32: GgmlType = GgmlType(0);
    /// IEEE half float.
    pub const F16: GgmlType = GgmlType(1);
    /// 4-bit, one f16 scale a block of 32.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// 4-bit, an f16 scale and an f16 minimum a block of 32.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// 8-bit, one f16 scale a block of 32.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// 4-bit k-quant (super-blocks of 256); listed, not dequantized here.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// 6-bit k-quant (super-blocks of 256); listed, not dequantized here.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType(30);

    /// The types [`dequantize`] reads.
    pub const DEQUANTIZED: [GgmlType; 6] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
    ];

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        TYPES.iter().find(|t| t.0 == self.0)
    }

    /// ggml's name for the type (`Q4_K`), or `None` for an id ggml does not define.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|t| t.1)
    }

    /// `(elements a block, bytes a block)`, or `None` for an unknown id.
    pub fn block(self) -> Option<(u64, u64)> {
        self.entry().map(|t| (t.2, t.3))
    }

    /// Whether [`dequantize`] reads this type.
    pub fn is_dequantized(self) -> bool {
        Self::DEQUANTIZED.contains(&self)
    }

    /// Bytes of `n` elements, or `None` for an unknown type, an `n` that is not a whole number of
    /// blocks, or an overflow.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (block, size) = self.block()?;
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(size)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "unknown ggml type {}", self.0),
        }
    }
}

impl fmt::Debug for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GgmlType({self})")
    }
}

/// Why bytes could not be (de)quantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgmlError {
    /// The type is not one [`dequantize`] reads (or [`quantize`] writes).
    #[error("ggml type {0} is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)")]
    Unsupported(GgmlType),
    /// The input is not a whole number of blocks.
    #[error("{len} {unit} are not a whole number of {ty} blocks ({block} {unit} each)")]
    Length {
        /// The type.
        ty: GgmlType,
        /// The input's length.
        len: usize,
        /// The length of one block in the same unit.
        block: u64,
        /// `bytes` or `values`.
        unit: &'static str,
    },
}

/// The f32 value of an IEEE half float (exact: every f16 is an f32).
pub fn f16_to_f32(h: u16) -> f32 {
    let negative = h & 0x8000 != 0;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let magnitude = match exp {
        // Zero and subnormals: mant · 2^-24, exact in f32.
        0 => mant as f32 * (1.0 / 16_777_216.0),
        0x1f => f32::from_bits(0x7f80_0000 | (mant << 13)),
        _ => f32::from_bits(((exp + 112) << 23) | (mant << 13)),
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// The nearest IEEE half float to `x` (ties to even, as the hardware conversion and ggml's
/// `GGML_FP32_TO_FP16` do); overflow gives infinity, NaN stays NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0xff {
        let nan = if mant != 0 {
            0x200 | (mant >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let half_exp = exp - 127 + 15;
    if half_exp >= 0x1f {
        return sign | 0x7c00;
    }
    if half_exp <= 0 {
        // A subnormal half: the value in units of 2^-24, rounded.
        let shift = (14 - half_exp) as u32;
        if shift > 24 {
            return sign;
        }
        let m = mant | 0x80_0000;
        return sign | round_shift(m, shift) as u16;
    }
    // Normal: a carry out of the mantissa moves into the exponent (up to infinity), as it should.
    sign | (((half_exp as u32) << 10) as u16 + round_shift(mant, 13) as u16)
}

/// `m >> shift` rounded to nearest, ties to even (`1 <= shift <= 24`).
fn round_shift(m: u32, shift: u32) -> u32 {
    let q = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// The f32 value of a bfloat16 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Dequantize `bytes` of type `ty` to f32, in storage order, exactly as ggml's
/// `dequantize_row_*` (and `gguf-py`'s numpy `dequantize`) compute it.
///
/// # Errors
///
/// [`GgmlError::Unsupported`] for a type outside [`GgmlType::DEQUANTIZED`];
/// [`GgmlError::Length`] when `bytes` is not a whole number of blocks.
pub fn dequantize(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, GgmlError> {
    let Some((_, block_bytes)) = ty.block().filter(|_| ty.is_dequantized()) else {
        return Err(GgmlError::Unsupported(ty));
    };
    if !(bytes.len() as u64).is_multiple_of(block_bytes) {
        return Err(GgmlError::Length {
            ty,
            len: bytes.len(),
            block: block_bytes,
            unit: "bytes",
        });
    }
    let blocks = bytes.chunks_exact(block_bytes as usize);
    let out = match ty {
        GgmlType::F32 => blocks
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => blocks.map(|b| half_at(b, 0)).collect(),
        GgmlType::BF16 => blocks
            .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        GgmlType::Q8_0 => blocks.flat_map(q8_0_block).collect(),
        GgmlType::Q4_0 => blocks.flat_map(q4_0_block).collect(),
        _ => blocks.flat_map(q4_1_block).collect(),
    };
    Ok(out)
}

fn q8_0_block(b: &[u8]) -> [f32; 32] {
    let d = half_at(b, 0);
    std::array::from_fn(|j| f32::from(b[2 + j] as i8) * d)
}

/// The 32 quants of a 4-bit block: `qs[j] & 0xf` for `j < 16`, `qs[j - 16] >> 4` after.
fn nibble(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    }
}

fn q4_0_block(b: &[u8]) -> [f32; 32] {
    let d = half_at(b, 0);
    std::array::from_fn(|j| f32::from(i16::from(nibble(&b[2..], j)) - 8) * d)
}

fn q4_1_block(b: &[u8]) -> [f32; 32] {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    std::array::from_fn(|j| f32::from(nibble(&b[4..], j)) * d + m)
}

/// Quantize `values` to Q8_0 exactly as ggml's `quantize_row_q8_0_ref` does: per block of 32,
/// `d = max|x| / 127` (stored as f16), `q = round(x · (1/d))` with the f32 `d` (ties away from
/// zero, C's `roundf`), and `q = 0` for an all-zero block.
///
/// # Errors
///
/// [`GgmlError::Length`] when `values.len()` is not a multiple of 32.
pub fn quantize_q8_0(values: &[f32]) -> Result<Vec<u8>, GgmlError> {
    if !values.len().is_multiple_of(32) {
        return Err(GgmlError::Length {
            ty: GgmlType::Q8_0,
            len: values.len(),
            block: 32,
            unit: "values",
        });
    }
    let mut out = Vec::with_capacity(values.len() / 32 * 34);
    for block in values.chunks_exact(32) {
        let amax = block.iter().fold(0.0f32, |a, x| a.max(x.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * id).round() as i8 as u8));
    }
    Ok(out)
}

/// Encode `values` as `ty`: F32 (exact), F16 (nearest, ties to even) or Q8_0
/// ([`quantize_q8_0`]).
///
/// # Errors
///
/// [`GgmlError::Unsupported`] for any other type; [`GgmlError::Length`] for Q8_0 values that
/// are not a whole number of blocks.
pub fn quantize(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, GgmlError> {
    match ty {
        GgmlType::F32 => Ok(values.iter().flat_map(|x| x.to_le_bytes()).collect()),
        GgmlType::F16 => Ok(values
            .iter()
            .flat_map(|x| f32_to_f16(*x).to_le_bytes())
            .collect()),
        GgmlType::Q8_0 => quantize_q8_0(values),
        _ => Err(GgmlError::Unsupported(ty)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half(x: f32) -> [u8; 2] {
        f32_to_f16(x).to_le_bytes()
    }

    #[test]
    fn f16_round_trips_every_half_and_rounds_ties_to_even() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f16_to_f32(f32_to_f16(x)).is_nan());
            } else {
                assert_eq!(f32_to_f16(x), h, "half {h:#06x} = {x}");
            }
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Overflow, the smallest subnormal's halfway point, and a subnormal rounding up to normal.
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5), 0x0001);
        assert_eq!(f32_to_f16(2f32.powi(-14) - 2f32.powi(-26)), 0x0400);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_is_the_top_half_of_an_f32() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
        assert_eq!(bf16_to_f32(0x3fc0), 1.5);
    }

    #[test]
    fn f32_f16_bf16_by_hand() {
        let f32s: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(dequantize(GgmlType::F32, &f32s).unwrap(), [1.5, -2.25]);
        let f16s = [0x00, 0x3c, 0x00, 0xb8, 0x01, 0x00];
        assert_eq!(
            dequantize(GgmlType::F16, &f16s).unwrap(),
            [1.0, -0.5, 2f32.powi(-24)]
        );
        let bf16s = [0x80, 0x3f, 0x40, 0xc0];
        assert_eq!(dequantize(GgmlType::BF16, &bf16s).unwrap(), [1.0, -3.0]);
    }

    #[test]
    fn q8_0_by_hand() {
        // d = 0.5; q = -128, -3, 0, 1, ..., 127 at the ends.
        let mut b = half(0.5).to_vec();
        let q: Vec<i8> = (0..32)
            .map(|j| match j {
                0 => -128,
                31 => 127,
                _ => j as i8 - 3,
            })
            .collect();
        b.extend(q.iter().map(|q| *q as u8));
        let x = dequantize(GgmlType::Q8_0, &b).unwrap();
        assert_eq!(x[0], -64.0);
        assert_eq!(x[1], -1.0);
        assert_eq!(x[3], 0.0);
        assert_eq!(x[4], 0.5);
        assert_eq!(x[31], 63.5);
        assert_eq!(x.len(), 32);
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 0.25; byte j = (hi << 4) | lo with lo = j % 16, hi = 15 - j % 16.
        let mut b = half(0.25).to_vec();
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let x = dequantize(GgmlType::Q4_0, &b).unwrap();
        for j in 0..16 {
            assert_eq!(x[j], (j as f32 - 8.0) * 0.25, "low nibble {j}");
            assert_eq!(x[j + 16], (7.0 - j as f32) * 0.25, "high nibble {j}");
        }
        assert_eq!(x[0], -2.0);
        assert_eq!(x[16], 1.75);
    }

    #[test]
    fn q4_1_by_hand() {
        // d = 2, m = -1: x = 2q - 1. Byte 0 = 0xf0 (lo 0, hi 15), byte 1 = 0x1e (lo 14, hi 1).
        let mut b = half(2.0).to_vec();
        b.extend(half(-1.0));
        let mut qs = [0u8; 16];
        qs[0] = 0xf0;
        qs[1] = 0x1e;
        b.extend(qs);
        let x = dequantize(GgmlType::Q4_1, &b).unwrap();
        assert_eq!(&x[..2], &[-1.0, 27.0]);
        assert_eq!(&x[16..18], &[29.0, 1.0]);
        assert_eq!(x[5], -1.0);
    }

    #[test]
    fn two_blocks_keep_their_order() {
        let mut b = half(1.0).to_vec();
        b.extend([1u8; 32]);
        b.extend(half(-2.0));
        b.extend([3u8; 32]);
        let x = dequantize(GgmlType::Q8_0, &b).unwrap();
        assert_eq!(x.len(), 64);
        assert!(x[..32].iter().all(|v| *v == 1.0));
        assert!(x[32..].iter().all(|v| *v == -6.0));
    }

    #[test]
    fn bad_lengths_and_types_are_errors() {
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 33]),
            Err(GgmlError::Length { .. })
        ));
        let e = dequantize(GgmlType::Q6_K, &[0; 210]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ggml type Q6_K is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
        );
        assert!(matches!(
            dequantize(GgmlType(99), &[]),
            Err(GgmlError::Unsupported(_))
        ));
        assert_eq!(GgmlType(99).to_string(), "unknown ggml type 99");
        assert!(quantize_q8_0(&[0.0; 31]).is_err());
    }

    #[test]
    fn q8_0_quantizes_as_ggml() {
        // max |x| = 2.54, d = 0.02, 1/d · x rounds half away from zero.
        let mut x = [0.0f32; 32];
        x[0] = 2.54;
        x[1] = -0.03; // -1.5 → -2
        x[2] = 0.01; // 0.5 → 1
        x[3] = -2.54;
        let b = quantize_q8_0(&x).unwrap();
        let d = 2.54f32 / 127.0;
        assert_eq!(&b[..2], &f32_to_f16(d).to_le_bytes());
        let id = 1.0 / d;
        assert_eq!(b[2] as i8, 127);
        assert_eq!(b[3] as i8, (-0.03f32 * id).round() as i8);
        assert_eq!(b[4] as i8, (0.01f32 * id).round() as i8);
        assert_eq!(b[5] as i8, -127);
        assert_eq!(b[6], 0);
        // An all-zero block: d = 0, every q = 0.
        assert_eq!(quantize_q8_0(&[0.0; 32]).unwrap(), vec![0u8; 34]);
    }

    /// Deterministic values of several magnitudes (a splitmix-style hash mapped to [-1, 1),
    /// scaled per block of 32 by 10^(k mod 7 - 3)), so that blocks have very different scales.
    fn spread(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let mut z = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                let unit = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                unit * 10f32.powi((i / 32 % 7) as i32 - 3)
            })
            .collect()
    }

    /// Quantize → dequantize: the stored layout is the one `dequantize` reads (an f16 `d`, then
    /// 32 `i8` in order); `q = round(x/d)` is within half a step, `|x − q·d| ≤ d/2` with the f32
    /// `d = max|x|/127`; the value read back, `q·f16(d)`, adds at most `127·|d − f16(d)|` to
    /// that (`≤ 127 · 2⁻¹¹ · d` where f16(d) is a normal half: 0.562·d in all).
    #[test]
    fn q8_0_round_trip_is_within_half_a_step() {
        let mut x = spread(32 * 21);
        x[32 * 3 + 7] = -3.0; // block 3 (values in [-1, 1)): its largest magnitude is negative
        x[32 * 9..32 * 10].fill(0.0); // an all-zero block
        let bytes = quantize(GgmlType::Q8_0, &x).unwrap();
        assert_eq!(bytes.len(), 21 * 34);
        let back = dequantize(GgmlType::Q8_0, &bytes).unwrap();
        assert_eq!(back.len(), x.len());
        let mut worst = 0.0f32;
        for (k, (block, b)) in x.chunks_exact(32).zip(bytes.chunks_exact(34)).enumerate() {
            let d = block.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
            let d16 = half_at(b, 0);
            assert_eq!(
                d16,
                f16_to_f32(f32_to_f16(d)),
                "block {k}: the stored scale"
            );
            for (j, &v) in block.iter().enumerate() {
                let q = f32::from(b[2 + j] as i8);
                let got = back[32 * k + j];
                assert_eq!(
                    got,
                    q * d16,
                    "block {k}, element {j}: dequantized as stored"
                );
                assert!(
                    (v - q * d).abs() <= d * 0.5 * (1.0 + 1e-6),
                    "block {k}, {j}: {v} vs {q}·{d}"
                );
                let bound = d * 0.5 * (1.0 + 1e-6) + 127.0 * (d - d16).abs();
                assert!(
                    (v - got).abs() <= bound,
                    "block {k}, {j}: |{v} − {got}| > {bound}"
                );
                // Below 2⁻¹⁴ (max|x| < 0.0078) f16(d) is subnormal and coarser than 2⁻¹¹·d.
                if d >= 2f32.powi(-14) {
                    worst = worst.max((v - got).abs() / d);
                }
            }
        }
        println!("Q8_0: max |x − x̂| / d = {worst} (blocks with a normal f16 d)");
        assert!(
            worst > 0.45 && worst <= 0.5 + 127.0 / 2048.0,
            "worst |x − x̂| / d = {worst}"
        );
        assert!(back[32 * 9..32 * 10].iter().all(|v| *v == 0.0));
        // The largest magnitude maps to ∓127 steps of d = max|x|/127.
        assert_eq!(bytes[3 * 34 + 2 + 7] as i8, -127);
        assert_eq!(
            back[32 * 3 + 7],
            -127.0 * f16_to_f32(f32_to_f16(3.0 / 127.0))
        );
    }

    /// F16 keeps every value an f16 can hold, bit for bit (signed zeros, subnormals, the
    /// largest finite, infinities); F32 keeps everything.
    #[test]
    fn f16_and_f32_round_trips_are_exact_on_representable_values() {
        let halves: Vec<f32> = (0..=u16::MAX)
            .map(f16_to_f32)
            .filter(|v| !v.is_nan())
            .collect();
        assert_eq!(halves.len(), 65536 - 2 * 1023);
        let bytes = quantize(GgmlType::F16, &halves).unwrap();
        assert_eq!(bytes.len(), 2 * halves.len());
        let back = dequantize(GgmlType::F16, &bytes).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&halves));
        let x = spread(100);
        let back = dequantize(GgmlType::F32, &quantize(GgmlType::F32, &x).unwrap()).unwrap();
        assert_eq!(bits(&back), bits(&x));
    }

    #[test]
    fn quantizing_a_partial_block_or_another_type_is_a_typed_error() {
        for n in [1, 31, 33, 48] {
            let e = quantize(GgmlType::Q8_0, &vec![0.5; n]).unwrap_err();
            let want = GgmlError::Length {
                ty: GgmlType::Q8_0,
                len: n,
                block: 32,
                unit: "values",
            };
            assert_eq!(e, want);
            assert_eq!(
                e.to_string(),
                format!("{n} values are not a whole number of Q8_0 blocks (32 values each)")
            );
        }
        assert_eq!(quantize(GgmlType::Q8_0, &[]).unwrap(), Vec::<u8>::new());
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::BF16, GgmlType(99)] {
            assert_eq!(quantize(ty, &[0.0; 32]), Err(GgmlError::Unsupported(ty)));
        }
    }
}
