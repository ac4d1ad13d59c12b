//! Grey-scale image data sets: IDX files (MNIST, Fashion-MNIST) and CSV rows of pixels
//! (MNIST-5k, scikit-learn's 8×8 digits), split with a seeded shuffle like text, normalised by
//! the training split's mean and deviation, batched as `[batch, 1, side, side]` tensors.

use std::io::Read;
use std::path::{Path, PathBuf};

use burn::prelude::*;
use mopt_core::{Examples, Labeled};
use mopt_recipe::{DataSource, DataSpec};

use crate::augment::Augmentation;
use crate::error::DataError;
use crate::labels::LabelMap;
use crate::rng::SplitMix64;

/// A batch of images on a device.
#[derive(Debug, Clone)]
pub struct ImageBatch {
    /// `[batch, channels, side, side]`, normalised.
    pub images: Tensor<4>,
    /// `[batch]`
    pub labels: Tensor<1, Int>,
}

impl Labeled for ImageBatch {
    fn labels(&self) -> Tensor<1, Int> {
        self.labels.clone()
    }
}

/// The geometry of a data set's images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageShape {
    /// Channels (1 for grey images).
    pub channels: usize,
    /// Side in pixels (square images).
    pub side: usize,
}

impl ImageShape {
    /// Values in one image.
    pub fn len(&self) -> usize {
        self.channels * self.side * self.side
    }

    /// Whether the split has no images.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How raw grey values become model inputs: `(p / pixel_max - mean) / std` (what a deployment
/// does before feeding the exported graph; saved with every checkpoint as `preprocess.json`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Normalize {
    /// The largest raw grey value (255, or 16 for scikit-learn's digits).
    pub pixel_max: f32,
    /// Mean of `pixel / pixel_max` over the training split.
    pub mean: f32,
    /// Standard deviation of `pixel / pixel_max` over the training split.
    pub std: f32,
}

/// One split of images, owned, normalised.
#[derive(Debug, Clone)]
pub struct ImageSplit {
    /// The images' shape.
    pub shape: ImageShape,
    /// `len × shape.len()` values, image after image.
    pub pixels: Vec<f32>,
    /// Each image's label id.
    pub labels: Vec<usize>,
    /// Crops and flips drawn for every batch (the training split's, when the recipe asks).
    pub augment: Option<Augmentation>,
}

impl ImageSplit {
    /// The first `n` images.
    pub fn head(&self, n: usize) -> ImageSplit {
        let n = n.min(self.labels.len());
        ImageSplit {
            shape: self.shape,
            pixels: self.pixels[..n * self.shape.len()].to_vec(),
            labels: self.labels[..n].to_vec(),
            augment: self.augment,
        }
    }

    /// Image `i`'s normalised values.
    pub fn image(&self, i: usize) -> &[f32] {
        let k = self.shape.len();
        &self.pixels[i * k..(i + 1) * k]
    }
}

impl Examples for ImageSplit {
    type Batch = ImageBatch;

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn label(&self, i: usize) -> usize {
        self.labels[i]
    }

    fn batch(&self, indices: &[usize], device: &Device) -> ImageBatch {
        let s = self.shape;
        let mut values = Vec::with_capacity(indices.len() * s.len());
        match &self.augment {
            None => {
                for &i in indices {
                    values.extend_from_slice(self.image(i));
                }
            }
            Some(a) => {
                let mut rng = a.batch_rng(indices);
                for &i in indices {
                    a.apply(self.image(i), s, &mut rng, &mut values);
                }
            }
        }
        let labels: Vec<i64> = indices.iter().map(|&i| self.labels[i] as i64).collect();
        ImageBatch {
            images: Tensor::from_data(
                TensorData::new(values, [indices.len(), s.channels, s.side, s.side]),
                device,
            ),
            labels: Tensor::from_data(TensorData::new(labels, [indices.len()]), device),
        }
    }

    /// The image's normalised values, rounded to 4 decimals.
    fn record(&self, i: usize) -> serde_json::Value {
        let v: Vec<f64> = self
            .image(i)
            .iter()
            .map(|&x| (x as f64 * 1e4).round() / 1e4)
            .collect();
        serde_json::json!(v)
    }
}

/// The three splits of an image data set.
#[derive(Debug, Clone)]
pub struct ImageSplits {
    /// The training split.
    pub train: ImageSplit,
    /// The validation split (carved from the training images when the data set has none).
    pub valid: ImageSplit,
    /// The test split.
    pub test: ImageSplit,
    /// Class names in label order.
    pub labels: LabelMap,
    /// The normalisation every split applies (the training split's statistics).
    pub normalize: Normalize,
}

/// Raw images as a data format reads them: grey values (0..=255) and label names.
pub struct RawImages {
    /// Every image's geometry.
    pub shape: ImageShape,
    /// The grey values, image after image.
    pub pixels: Vec<u8>,
    /// Each image's label.
    pub labels: Vec<String>,
}

/// How a data format reads one file into images.
pub type ReadImages<'a> = &'a dyn Fn(&Path) -> Result<RawImages, DataError>;

type Raw = RawImages;

impl Raw {
    fn len(&self) -> usize {
        self.labels.len()
    }

    /// Keep the images at `order`, in that order.
    fn pick(&self, order: &[usize]) -> Raw {
        let k = self.shape.len();
        let mut pixels = Vec::with_capacity(order.len() * k);
        for &i in order {
            pixels.extend_from_slice(&self.pixels[i * k..(i + 1) * k]);
        }
        Raw {
            shape: self.shape,
            pixels,
            labels: order.iter().map(|&i| self.labels[i].clone()).collect(),
        }
    }
}

/// Read a file whole, gunzipping it as it streams past when its name ends in `.gz` (the
/// compressed bytes are never held beside the content).
fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    if path.extension().is_some_and(|e| e == "gz") {
        let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(std::io::BufReader::new(file))
            .read_to_end(&mut out)
            .map_err(|e| {
                DataError::format(
                    path,
                    format!("not a readable gzip file ({e})"),
                    "fetch it again (datasets/fetch.sh checks its sha256)",
                )
            })?;
        return Ok(out);
    }
    std::fs::read(path).map_err(|e| DataError::io(path, e))
}

/// The labels file that belongs to an IDX images file (`train-images-idx3-ubyte.gz` →
/// `train-labels-idx1-ubyte.gz`).
pub fn idx_labels_path(images: &Path) -> Option<PathBuf> {
    let name = images.file_name()?.to_str()?;
    name.contains("-images-idx3-")
        .then(|| images.with_file_name(name.replace("-images-idx3-", "-labels-idx1-")))
}

/// An IDX header: magic (two zero bytes, type 0x08 = u8, rank), then one big-endian u32 a dim.
fn idx_dims(bytes: &[u8], path: &Path, rank: usize) -> Result<Vec<usize>, DataError> {
    let bad = |m: String| {
        DataError::format(
            path,
            m,
            "an IDX file of unsigned bytes (MNIST / Fashion-MNIST layout)",
        )
    };
    if bytes.len() < 4 + 4 * rank || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 8 {
        return Err(bad("not an IDX file of unsigned bytes".into()));
    }
    if bytes[3] as usize != rank {
        return Err(bad(format!("rank {} where {rank} was expected", bytes[3])));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| {
            let o = 4 + 4 * i;
            u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]) as usize
        })
        .collect();
    let want = 4 + 4 * rank + dims.iter().product::<usize>();
    if bytes.len() != want {
        return Err(bad(format!(
            "{} bytes where the header promises {want} (truncated?)",
            bytes.len()
        )));
    }
    Ok(dims)
}

/// Read an IDX images file and the labels file beside it.
pub fn read_idx(images: &Path) -> Result<RawImages, DataError> {
    let labels_path = idx_labels_path(images).ok_or_else(|| {
        DataError::format(
            images,
            "cannot tell where its labels are",
            "name the images file `…-images-idx3-ubyte[.gz]` with `…-labels-idx1-ubyte[.gz]` beside it",
        )
    })?;
    let ib = read_bytes(images)?;
    let dims = idx_dims(&ib, images, 3)?;
    if dims[1] != dims[2] {
        return Err(DataError::format(
            images,
            format!("{}×{} images are not square", dims[1], dims[2]),
            "mopt reads square grey images",
        ));
    }
    let lb = read_bytes(&labels_path)?;
    let ldims = idx_dims(&lb, &labels_path, 1)?;
    if ldims[0] != dims[0] {
        return Err(DataError::format(
            &labels_path,
            format!("{} labels for {} images", ldims[0], dims[0]),
            "use the labels file of the same split",
        ));
    }
    Ok(Raw {
        shape: ImageShape {
            channels: 1,
            side: dims[1],
        },
        pixels: ib[16..].to_vec(),
        labels: lb[8..].iter().map(|l| l.to_string()).collect(),
    })
}

/// Read a CSV of pixel rows (`side²` values, then the label; no header).
pub fn read_pixels_csv(path: &Path, pixel_max: f64) -> Result<RawImages, DataError> {
    let bytes = read_bytes(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| DataError::format(path, "not UTF-8 text", "a CSV of numbers"))?;
    let (mut pixels, mut labels, mut width) = (Vec::new(), Vec::new(), None);
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let w = *width.get_or_insert(fields.len());
        let bad = |m: String| {
            DataError::format(
                path,
                format!("line {}: {m}", n + 1),
                "every row holds side×side grey values, then the label, no header",
            )
        };
        if fields.len() != w {
            return Err(bad(format!(
                "{} values where the first row has {w}",
                fields.len()
            )));
        }
        for f in &fields[..w - 1] {
            let v: f64 = f
                .parse()
                .map_err(|_| bad(format!("`{f}` is not a number")))?;
            if !(0.0..=pixel_max).contains(&v) {
                return Err(bad(format!(
                    "grey value {v} is outside 0..={pixel_max} (data.pixel-max)"
                )));
            }
            pixels.push((v / pixel_max * 255.0).round() as u8);
        }
        let label = fields[w - 1];
        labels.push(
            label
                .parse::<f64>()
                .map_or(label.to_string(), |v| v.to_string()),
        );
    }
    let side = width.map_or(0, |w| ((w - 1) as f64).sqrt().round() as usize);
    if labels.is_empty() || side * side + 1 != width.unwrap_or(0) {
        return Err(DataError::format(
            path,
            format!(
                "{} rows of {} values: not side×side pixels and a label",
                labels.len(),
                width.unwrap_or(0)
            ),
            "a CSV of square grey images (784 + 1 or 64 + 1 values a row)",
        ));
    }
    Ok(Raw {
        shape: ImageShape { channels: 1, side },
        pixels,
        labels,
    })
}

/// Split off the first `round(n × fraction)` images of a shuffled set.
fn carve(all: Raw, fraction: f64, rng: &mut SplitMix64) -> (Raw, Raw) {
    let mut order: Vec<usize> = (0..all.len()).collect();
    rng.shuffle(&mut order);
    let k = (all.len() as f64 * fraction).round() as usize;
    (all.pick(&order[..k]), all.pick(&order[k..]))
}

/// The three raw splits the recipe's `[data]` describes (before `max-train` / `max-eval`).
fn raw_splits(spec: &DataSpec, read_raw: ReadImages) -> Result<(Raw, Raw, Raw), DataError> {
    let mut rng = SplitMix64::new(spec.split_seed());
    Ok(match &spec.source {
        DataSource::Single {
            path,
            valid_fraction,
            test_fraction,
        } => {
            let all = read_raw(path)?;
            let n = all.len() as f64;
            let (test, rest) = carve(all, *test_fraction, &mut rng);
            let (valid, train) = carve(
                rest,
                *valid_fraction * n / (n - test.len() as f64),
                &mut rng,
            );
            (train, valid, test)
        }
        DataSource::Files {
            train,
            valid,
            test,
            valid_fraction,
        } => {
            let tr = read_raw(train)?;
            let test = read_raw(test)?;
            let (valid, train) = match valid {
                Some(v) => (read_raw(v)?, tr),
                None => carve(tr, *valid_fraction, &mut rng),
            };
            (train, valid, test)
        }
    })
}

/// Load, split and normalise the images the recipe's `[data]` describes, each file read by
/// `read` (the data format's; grey values scaled by `pixel_max`). The label map is `labels`
/// (a teacher's, the recipe's), else the training split's sorted labels.
pub fn load_image_splits(
    spec: &DataSpec,
    (read, pixel_max): (ReadImages, f64),
    labels: Option<LabelMap>,
) -> Result<ImageSplits, DataError> {
    let (mut train, mut valid, mut test) = raw_splits(spec, read)?;
    let anchor = spec.anchor();
    for (name, s) in [("validation", &valid), ("test", &test)] {
        if s.shape != train.shape {
            return Err(DataError::format(
                anchor,
                format!(
                    "{name} images are {}×{}, training images {}×{}",
                    s.shape.side, s.shape.side, train.shape.side, train.shape.side
                ),
                "use splits of one data set",
            ));
        }
    }
    if let Some(n) = spec.max_train {
        train = train.pick(&(0..n.min(train.len())).collect::<Vec<_>>());
    }
    if let Some(n) = spec.max_eval {
        valid = valid.pick(&(0..n.min(valid.len())).collect::<Vec<_>>());
        test = test.pick(&(0..n.min(test.len())).collect::<Vec<_>>());
    }
    let labels =
        labels.unwrap_or_else(|| LabelMap::from_examples(train.labels.iter().map(String::as_str)));
    if labels.len() < 2 {
        return Err(DataError::format(
            anchor,
            format!("the training split has {} class", labels.len()),
            "a classifier needs at least two classes",
        ));
    }
    let normalize = statistics(&train, pixel_max);
    let split = |r: &Raw, name: &str| normalized(r, &labels, normalize, anchor, name);
    Ok(ImageSplits {
        train: split(&train, "training")?,
        valid: split(&valid, "validation")?,
        test: split(&test, "test")?,
        labels,
        normalize,
    })
}

/// Mean and deviation of the training split's values scaled to 0..=1 (stored grey values are
/// rescaled to 0..=255 as they are read).
fn statistics(train: &Raw, pixel_max: f64) -> Normalize {
    let n = train.pixels.len().max(1) as f64;
    let mean = train.pixels.iter().map(|&p| p as f64 / 255.0).sum::<f64>() / n;
    let var = train
        .pixels
        .iter()
        .map(|&p| (p as f64 / 255.0 - mean).powi(2))
        .sum::<f64>()
        / n;
    Normalize {
        pixel_max: pixel_max as f32,
        mean: mean as f32,
        std: var.sqrt().max(1e-6) as f32,
    }
}

fn normalized(
    raw: &Raw,
    labels: &LabelMap,
    n: Normalize,
    anchor: &Path,
    split: &str,
) -> Result<ImageSplit, DataError> {
    let ids = raw
        .labels
        .iter()
        .map(|l| {
            labels.id(l).ok_or_else(|| {
                DataError::format(
                    anchor,
                    format!(
                        "the {split} split has label `{l}`, which the label map lacks ({})",
                        labels.labels.join(", ")
                    ),
                    "list every class in [data] labels, or use the teacher's data",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ImageSplit {
        shape: raw.shape,
        pixels: raw
            .pixels
            .iter()
            .map(|&p| (p as f32 / 255.0 - n.mean) / n.std)
            .collect(),
        labels: ids,
        augment: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dir: &Path, name: &str, rank: u8, dims: &[u32], body: &[u8]) -> PathBuf {
        let mut b = vec![0, 0, 8, rank];
        for d in dims {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b.extend_from_slice(body);
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        p
    }

    #[test]
    fn idx_images_read_with_their_labels_and_truncation_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let img = idx(
            dir.path(),
            "t-images-idx3-ubyte",
            3,
            &[2, 2, 2],
            &[0, 255, 0, 255, 9, 9, 9, 9],
        );
        idx(dir.path(), "t-labels-idx1-ubyte", 1, &[2], &[3, 7]);
        let raw = read_idx(&img).unwrap();
        assert_eq!(
            raw.shape,
            ImageShape {
                channels: 1,
                side: 2
            }
        );
        assert_eq!(raw.labels, ["3", "7"]);
        assert_eq!(raw.pixels[4..], [9, 9, 9, 9]);
        let cut = idx(
            dir.path(),
            "u-images-idx3-ubyte",
            3,
            &[2, 2, 2],
            &[0, 255, 0],
        );
        idx(dir.path(), "u-labels-idx1-ubyte", 1, &[2], &[3, 7]);
        let err = read_idx(&cut).err().unwrap().to_string();
        assert!(
            err.contains("u-images-idx3-ubyte") && err.contains("truncated"),
            "{err}"
        );
    }

    #[test]
    fn pixel_rows_scale_by_pixel_max_and_batches_are_normalised() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.csv");
        std::fs::write(&p, "0,16,16,0,1\n16,0,0,16,0\n8,8,8,8,1\n").unwrap();
        let raw = read_pixels_csv(&p, 16.0).unwrap();
        assert_eq!(raw.shape.side, 2);
        assert_eq!(raw.pixels[..4], [0, 255, 255, 0]);
        assert_eq!(raw.labels, ["1", "0", "1"]);
        let stats = statistics(&raw, 16.0);
        let labels = LabelMap::from_examples(raw.labels.iter().map(String::as_str));
        let split = normalized(&raw, &labels, stats, &p, "training").unwrap();
        let mean: f32 = split.pixels.iter().sum::<f32>() / split.pixels.len() as f32;
        assert!(mean.abs() < 1e-5, "{mean}");
        let b = split.batch(&[2, 0], &Device::flex());
        assert_eq!(b.images.dims(), [2, 1, 2, 2]);
        let l: Vec<i64> = b.labels.into_data().convert::<i64>().try_to_vec().unwrap();
        assert_eq!(l, [1, 1]);
        std::fs::write(&p, "0,16,16,1\n").unwrap();
        let err = read_pixels_csv(&p, 16.0).err().unwrap().to_string();
        assert!(err.contains("not side×side"), "{err}");
    }
}
