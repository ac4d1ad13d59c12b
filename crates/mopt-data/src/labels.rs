//! Label names ↔ ids, stored with every run and checkpoint.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::DataError;

/// Ordered class names; the id of a label is its index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelMap {
    /// Class names; a label's id is its position.
    pub labels: Vec<String>,
}

impl LabelMap {
    /// A map of `labels`, in this order.
    pub fn new(labels: Vec<String>) -> Self {
        Self { labels }
    }

    /// Sorted distinct labels.
    pub fn from_examples<'a>(labels: impl IntoIterator<Item = &'a str>) -> Self {
        let set: BTreeSet<&str> = labels.into_iter().collect();
        Self {
            labels: set.into_iter().map(String::from).collect(),
        }
    }

    /// The id of `label`, if it is known.
    pub fn id(&self, label: &str) -> Option<usize> {
        self.labels.iter().position(|l| l == label)
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no classes.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Write the map to `path` as JSON (`{"labels": [..]}`).
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        std::fs::write(path, serde_json::to_string_pretty(self).expect("json"))
            .map_err(|e| DataError::io(path, e))
    }

    /// Read a map written by [`save`](LabelMap::save).
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
        serde_json::from_str(&text).map_err(|e| {
            DataError::format(
                path,
                format!("bad label map: {e}"),
                "expected {\"labels\": [..]}",
            )
        })
    }
}
