//! [`Params`]: the `:param` / `*name` captures of the last match, as byte ranges into the path.
//!
//! Owns a reusable buffer only. Names are copied into one preallocated string so a capture
//! costs no allocation once the buffer has reached the largest route's needs; values are never
//! copied (they are ranges into `MatchRequest::path()`).

use std::ops::Range;

#[derive(Debug, Clone, Copy)]
struct Entry {
    name: (u32, u32),
    value: (u32, u32),
}

/// Captured `:param` values: (name, byte range into `req.path()`). Reuse it across requests.
#[derive(Debug, Clone)]
pub struct Params {
    names: String,
    entries: Vec<Entry>,
}

impl Default for Params {
    fn default() -> Self {
        Self::new()
    }
}

impl Params {
    /// Room for 8 captures and 128 bytes of names before any growth.
    pub fn new() -> Self {
        Params {
            names: String::with_capacity(128),
            entries: Vec::with_capacity(8),
        }
    }

    /// Forgets every capture, keeping the capacity.
    pub fn clear(&mut self) {
        self.names.clear();
        self.entries.clear();
    }

    /// Number of captures.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing was captured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value captured for `name`, sliced from `path` (the path that was matched).
    pub fn get<'p>(&self, name: &str, path: &'p str) -> Option<&'p str> {
        self.iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, r)| path.get(r))
    }

    /// `(name, byte range into the matched path)` in pattern order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Range<usize>)> + '_ {
        self.entries.iter().map(move |e| {
            let name = self
                .names
                .get(e.name.0 as usize..e.name.1 as usize)
                .unwrap_or("");
            (name, e.value.0 as usize..e.value.1 as usize)
        })
    }

    pub(crate) fn push(&mut self, name: &str, value: Range<usize>) {
        let start = self.names.len() as u32;
        self.names.push_str(name);
        self.entries.push(Entry {
            name: (start, self.names.len() as u32),
            value: (value.start as u32, value.end as u32),
        });
    }

    /// Checkpoint for backtracking: pass it to [`Params::truncate`].
    pub(crate) fn mark(&self) -> (usize, usize) {
        (self.entries.len(), self.names.len())
    }

    pub(crate) fn truncate(&mut self, mark: (usize, usize)) {
        self.entries.truncate(mark.0);
        self.names.truncate(mark.1);
    }
}
