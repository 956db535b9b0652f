//! The bench's own record of which frames an allocator has handed out, and the fragmentation
//! figure computed from it alone, so that the same code measures every allocator:
//!
//! `HBA_k` (huge-block availability) = free frames that lie in fully free, naturally aligned
//! blocks of `2^k` frames / all free frames. It is 1 − Linux's `unusable_free_index(k)`.
#![deny(unsafe_code)]

/// A set of held frames out of `0..frames` (frame numbers relative to the allocator's first
/// frame, which is aligned to every block size measured), one bit per frame.
#[derive(Clone, Debug)]
pub struct HeldFrames {
    words: Vec<u64>,
    frames: u64,
    held: u64,
}

impl HeldFrames {
    /// Frames `0..frames`, none held.
    pub fn new(frames: u64) -> HeldFrames {
        HeldFrames {
            words: vec![0; frames.div_ceil(64) as usize],
            frames,
            held: 0,
        }
    }

    /// How many frames the set covers.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Frames held.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Frames not held.
    pub fn free(&self) -> u64 {
        self.frames - self.held
    }

    /// Whether `frame` is held.
    pub fn is_held(&self, frame: u64) -> bool {
        self.words[(frame / 64) as usize] & (1 << (frame % 64)) != 0
    }

    /// Marks the `2^order` frames from `first` held. Returns false (and changes nothing) if
    /// the block leaves `0..frames`, is misaligned, or any of its frames is already held: an
    /// allocator handed out a frame twice or one it does not own.
    pub fn hold(&mut self, first: u64, order: u8) -> bool {
        let n = 1u64 << order;
        if !first.is_multiple_of(n) || first.checked_add(n).is_none_or(|e| e > self.frames) {
            return false;
        }
        if (first..first + n).any(|f| self.is_held(f)) {
            return false;
        }
        for f in first..first + n {
            self.words[(f / 64) as usize] |= 1 << (f % 64);
        }
        self.held += n;
        true
    }

    /// Marks the `2^order` frames from `first` free again. Returns false (and changes nothing)
    /// unless every one of them is held.
    pub fn release(&mut self, first: u64, order: u8) -> bool {
        let n = 1u64 << order;
        if first.checked_add(n).is_none_or(|e| e > self.frames)
            || !(first..first + n).all(|f| self.is_held(f))
        {
            return false;
        }
        for f in first..first + n {
            self.words[(f / 64) as usize] &= !(1 << (f % 64));
        }
        self.held -= n;
        true
    }

    /// Fully free, naturally aligned blocks of `2^order` frames that lie wholly in `0..frames`.
    pub fn free_blocks(&self, order: u8) -> u64 {
        let n = 1u64 << order;
        (0..self.frames / n)
            .filter(|b| self.block_is_free(b * n, order))
            .count() as u64
    }

    fn block_is_free(&self, first: u64, order: u8) -> bool {
        if order >= 6 {
            let (w, words) = ((first / 64) as usize, 1usize << (order - 6));
            self.words[w..w + words].iter().all(|&x| x == 0)
        } else {
            let mask = ((1u64 << (1 << order)) - 1) << (first % 64);
            self.words[(first / 64) as usize] & mask == 0
        }
    }

    /// `HBA_order`: free frames in fully free aligned `2^order` blocks over all free frames;
    /// `None` when no frame is free.
    pub fn hba(&self, order: u8) -> Option<f64> {
        let free = self.free();
        (free > 0).then(|| (self.free_blocks(order) << order) as f64 / free as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition frame by frame: a free frame counts if every frame of its aligned block
    /// is inside the range and free.
    fn hba_by_frames(held: &[bool], order: u8) -> Option<f64> {
        let n = 1usize << order;
        let free: Vec<usize> = (0..held.len()).filter(|&f| !held[f]).collect();
        let whole = free
            .iter()
            .filter(|&&f| {
                let start = f - f % n;
                start + n <= held.len() && (start..start + n).all(|g| !held[g])
            })
            .count();
        (!free.is_empty()).then(|| whole as f64 / free.len() as f64)
    }

    #[test]
    fn hba_agrees_with_a_frame_by_frame_count() {
        // 3 blocks of 512 and a 100-frame tail: block 0 holds one frame, block 1 is free,
        // block 2 holds 512 frames, the tail is free but no whole block.
        let frames = 3 * 512 + 100;
        let mut held = vec![false; frames];
        let mut set = HeldFrames::new(frames as u64);
        for f in [7usize].into_iter().chain(1024..1536) {
            held[f] = true;
            assert!(set.hold(f as u64, 0));
        }
        assert_eq!(set.free(), (frames - 513) as u64);
        assert_eq!(set.free_blocks(9), 1);
        let by_frames = hba_by_frames(&held, 9).unwrap();
        assert!((by_frames - 512.0 / 1123.0).abs() < 1e-12);
        assert_eq!(set.hba(9), Some(by_frames));
        for order in [0u8, 1, 3, 5, 6, 7] {
            assert_eq!(set.hba(order), hba_by_frames(&held, order), "order {order}");
        }
        assert_eq!(set.hba(18), Some(0.0), "no whole 1 GiB block in the range");
    }

    #[test]
    fn hba_on_random_sets() {
        let mut rng = crate::bench::Rng::new(5);
        for round in 0..20 {
            let frames = 2048 + (rng.next_u64() % 700) as usize;
            let density = 1 + rng.next_u64() % 200;
            let mut held = vec![false; frames];
            let mut set = HeldFrames::new(frames as u64);
            for (f, h) in held.iter_mut().enumerate() {
                if rng.next_u64() % 1000 < density {
                    *h = true;
                    assert!(set.hold(f as u64, 0));
                }
            }
            for order in [0u8, 4, 6, 8, 9, 10] {
                assert_eq!(
                    set.hba(order),
                    hba_by_frames(&held, order),
                    "round {round} order {order}"
                );
            }
        }
    }

    #[test]
    fn misuse_is_refused() {
        let mut set = HeldFrames::new(1024);
        assert!(set.hold(512, 9));
        assert!(!set.hold(512, 0), "held twice");
        assert!(!set.hold(256, 9), "misaligned");
        assert!(!set.hold(1024, 0), "outside");
        assert!(!set.release(0, 0), "not held");
        assert!(set.release(600, 0));
        assert!(!set.release(512, 9), "partly held");
        assert_eq!(set.held(), 511);
        assert_eq!(set.hba(9), Some(512.0 / 513.0));
        assert_eq!(HeldFrames::new(0).hba(9), None);
    }
}
