//! The shapes of the machine tables that mock machines boot, in plain numbers.

/// Row-major distances of `n` nodes: 10 to itself, 20 to every other node (Linux's
/// `LOCAL_DISTANCE` and `REMOTE_DISTANCE`).
pub fn uniform_distances(n: usize) -> Vec<u8> {
    (0..n * n)
        .map(|i| if i / n == i % n { 10 } else { 20 })
        .collect()
}

/// One node's memory: frames `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The node's index.
    pub node: usize,
    /// The first frame number.
    pub start: u64,
    /// One past the last frame number.
    pub end: u64,
}

/// Nodes of `frames[i]` frames each, laid out back to back in node order from frame `base`; a
/// node of 0 frames is memoryless and gets no span.
pub fn back_to_back(frames: &[u64], base: u64) -> Vec<Span> {
    let mut start = base;
    let mut spans = Vec::new();
    for (node, &f) in frames.iter().enumerate() {
        if f > 0 {
            spans.push(Span {
                node,
                start,
                end: start + f,
            });
            start += f;
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_tables() {
        assert_eq!(uniform_distances(1), [10]);
        assert_eq!(uniform_distances(3), [10, 20, 20, 20, 10, 20, 20, 20, 10]);
    }

    #[test]
    fn spans_skip_memoryless_nodes() {
        let s = |node, start, end| Span { node, start, end };
        assert_eq!(
            back_to_back(&[5, 0, 3], 100),
            [s(0, 100, 105), s(2, 105, 108)]
        );
        assert!(back_to_back(&[0, 0], 7).is_empty());
    }
}
