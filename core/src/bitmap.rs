//! Bitmaps of the 512 frames of one pageblock: the operations a split pageblock needs, on plain
//! words (the zone lock guards every plane).
//!
//! Bit `i` of a [`Plane`] is frame `i` of its pageblock: word `i / 64`, bit `i % 64`. Every search
//! is a bounded scan of the eight words, so each operation is O(1).
#![deny(unsafe_code)]

/// Frames in a pageblock.
pub(crate) const FRAMES: usize = 512;
const WORDS: usize = FRAMES / 64;

/// One bit per frame of a pageblock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(64))]
pub(crate) struct Plane(pub(crate) [u64; WORDS]);

/// A mask of `len` bits from bit `lo` of a word (`lo + len <= 64`).
fn mask(lo: usize, len: usize) -> u64 {
    debug_assert!(lo + len <= 64);
    if len == 64 {
        !0
    } else {
        ((1u64 << len) - 1) << lo
    }
}

impl Plane {
    /// All bits clear.
    pub(crate) const EMPTY: Plane = Plane([0; WORDS]);
    /// All bits set.
    pub(crate) const FULL: Plane = Plane([!0; WORDS]);

    /// Bit `i`.
    pub(crate) fn get(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 != 0
    }

    /// Sets or clears bit `i`.
    pub(crate) fn put(&mut self, i: usize, on: bool) {
        let b = 1u64 << (i % 64);
        if on {
            self.0[i / 64] |= b;
        } else {
            self.0[i / 64] &= !b;
        }
    }

    /// Calls `f(word, mask)` for the words covering bits `start..start + len`.
    fn words(start: usize, len: usize, mut f: impl FnMut(usize, u64)) {
        let (mut i, end) = (start, start + len);
        while i < end {
            let lo = i % 64;
            let n = (64 - lo).min(end - i);
            f(i / 64, mask(lo, n));
            i += n;
        }
    }

    /// Sets (`on`) or clears bits `start..start + len`. Inlined for the single bit of an
    /// order-0 block, which most calls change.
    #[inline]
    pub(crate) fn fill(&mut self, start: usize, len: usize, on: bool) {
        if len == 1 {
            self.put(start, on);
        } else {
            self.fill_words(start, len, on);
        }
    }

    /// [`Plane::fill`] word by word.
    fn fill_words(&mut self, start: usize, len: usize, on: bool) {
        Self::words(start, len, |w, m| {
            if on {
                self.0[w] |= m;
            } else {
                self.0[w] &= !m;
            }
        });
    }

    /// `true` if every bit of `start..start + len` equals `on`.
    pub(crate) fn all(&self, start: usize, len: usize, on: bool) -> bool {
        let mut all = true;
        Self::words(start, len, |w, m| {
            let bits = self.0[w] & m;
            all &= if on { bits == m } else { bits == 0 };
        });
        all
    }

    /// Number of set bits.
    pub(crate) fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// `true` if every bit set in `other` is set here.
    pub(crate) fn covers(&self, other: &Plane) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| b & !a == 0)
    }

    /// Sets every bit set in `other`.
    pub(crate) fn set_from(&mut self, other: &Plane) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
    }

    /// Clears every bit set in `other`.
    pub(crate) fn clear_from(&mut self, other: &Plane) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a &= !b;
        }
    }

    /// The plane whose bit `i` is bit `i + 1` of this one (bit 511 clear): what follows each
    /// frame.
    pub(crate) fn following(&self) -> Plane {
        let mut p = Plane::EMPTY;
        for w in 0..WORDS {
            let carry = if w + 1 < WORDS {
                self.0[w + 1] << 63
            } else {
                0
            };
            p.0[w] = self.0[w] >> 1 | carry;
        }
        p
    }

    /// The first set bit at or after `from`, if any.
    pub(crate) fn next_set(&self, from: usize) -> Option<usize> {
        if from >= FRAMES {
            return None;
        }
        let mut w = from / 64;
        let mut word = self.0[w] & (!0u64 << (from % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            if w == WORDS {
                return None;
            }
            word = self.0[w];
        }
    }

    /// The first naturally aligned run of `2^order` clear bits (`order <= 9`), if any.
    pub(crate) fn find_clear_run(&self, order: u8) -> Option<usize> {
        let len = 1usize << order;
        if len >= 64 {
            let step = len / 64;
            return (0..WORDS)
                .step_by(step)
                .find(|&w| self.0[w..w + step].iter().all(|x| *x == 0))
                .map(|w| w * 64);
        }
        let stride = STRIDE[usize::from(order)];
        for (w, &word) in self.0.iter().enumerate() {
            // Fold the free bits so that bit `k * len` is set only if bits `k*len..(k+1)*len`
            // are all free.
            let mut free = !word;
            let mut span = 1;
            while span < len {
                free &= free >> span;
                span *= 2;
            }
            let aligned = free & stride;
            if aligned != 0 {
                return Some(w * 64 + aligned.trailing_zeros() as usize);
            }
        }
        None
    }
}

/// A set of 512 bucket numbers with a summary of its non-empty words: the occupancy masks an
/// allocation searches for its fullest bucket, where [`Plane::next_set`] would look at each
/// empty word in turn. `next_set` reads at most two words and the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Occupancy {
    bits: Plane,
    /// Bit `w` set while word `w` of `bits` is not zero.
    words: u8,
}

impl Occupancy {
    /// No bucket.
    pub(crate) const EMPTY: Occupancy = Occupancy {
        bits: Plane::EMPTY,
        words: 0,
    };

    /// Bucket `i`.
    pub(crate) fn get(&self, i: usize) -> bool {
        self.bits.get(i)
    }

    /// Adds (`on`) or removes bucket `i`.
    #[inline(always)]
    pub(crate) fn put(&mut self, i: usize, on: bool) {
        self.bits.put(i, on);
        let w = i / 64;
        if self.bits.0[w] != 0 {
            self.words |= 1 << w;
        } else {
            self.words &= !(1 << w);
        }
    }

    /// The first bucket at or after `from`, if any.
    pub(crate) fn next_set(&self, from: usize) -> Option<usize> {
        if from >= FRAMES {
            return None;
        }
        let w = from / 64;
        let word = self.bits.0[w] & (!0u64 << (from % 64));
        if word != 0 {
            return Some(w * 64 + word.trailing_zeros() as usize);
        }
        let above = u32::from(self.words) & !((2u32 << w) - 1);
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.bits.0[w].trailing_zeros() as usize)
    }
}

/// Bits `0, len, 2·len, …` of a word, for runs of `len = 2^order` bits (order below 6): where
/// an aligned run of that length may start.
const STRIDE: [u64; 6] = {
    let mut t = [0u64; 6];
    let mut order = 0;
    while order < 6 {
        let mut i = 0;
        while i < 64 {
            t[order] |= 1 << i;
            i += 1 << order;
        }
        order += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain transcription of the definitions, bit by bit: the oracle for the word tricks.
    fn naive_run(p: &Plane, order: u8) -> Option<usize> {
        let len = 1usize << order;
        (0..FRAMES)
            .step_by(len)
            .find(|&s| (s..s + len).all(|i| !p.get(i)))
    }

    fn planes() -> impl Iterator<Item = Plane> {
        let mut rng = numaframe_testkit_base::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next_u64();
        (0..400).map(move |i| {
            let mut p = Plane::EMPTY;
            for w in 0..WORDS {
                // Dense, sparse and mixed words, so runs of every length occur.
                p.0[w] = match (i + w) % 4 {
                    0 => next() | next(),
                    1 => next() & next() & next(),
                    2 => next(),
                    _ => 0,
                };
            }
            p
        })
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe bit arithmetic over every plane and order: the release-checked run covers it"
    )]
    fn runs_match_a_bit_by_bit_search() {
        for p in planes() {
            for order in 0..=9 {
                assert_eq!(
                    p.find_clear_run(order),
                    naive_run(&p, order),
                    "{p:?} {order}"
                );
            }
            let next = p.following();
            assert!((0..FRAMES).all(|i| next.get(i) == (i + 1 < FRAMES && p.get(i + 1))));
            assert_eq!(p.count(), (0..FRAMES).filter(|&i| p.get(i)).count());
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe bit arithmetic over many random sets: the release-checked run covers it"
    )]
    fn occupancy_finds_what_a_plane_finds() {
        let mut rng = numaframe_testkit_base::Rng::new(0x2545_f491_4f6c_dd1d);
        let (mut o, mut p) = (Occupancy::EMPTY, Plane::EMPTY);
        for step in 0..20_000 {
            // Sparse sets, dense ones, and every word emptied again on the way.
            let i = (rng.next_u64() % FRAMES as u64) as usize;
            let on = rng.next_u64() % 4 < if step % 5000 < 2500 { 1 } else { 3 };
            o.put(i, on);
            p.put(i, on);
            let from = (rng.next_u64() % (FRAMES as u64 + 2)) as usize;
            assert_eq!(o.next_set(from), p.next_set(from), "{p:?} from {from}");
            assert_eq!(o.get(i), p.get(i));
        }
    }

    #[test]
    fn ranges_fill_and_count() {
        let mut p = Plane::EMPTY;
        p.fill(60, 10, true);
        assert!(p.all(60, 10, true) && !p.get(59) && !p.get(70));
        assert_eq!(p.count(), 10);
        assert_eq!(p.next_set(0), Some(60));
        assert_eq!(p.next_set(70), None);
        p.fill(0, FRAMES, true);
        assert_eq!(p, Plane::FULL);
        p.fill(128, 128, false);
        assert_eq!(p.find_clear_run(7), Some(128));
        assert_eq!(p.find_clear_run(8), None);
        p.put(5, false);
        assert!(!p.get(5));
        let mut q = Plane::EMPTY;
        q.fill(3, 4, true);
        assert!(!p.covers(&q) && Plane::FULL.covers(&q) && q.covers(&Plane::EMPTY));
        p.set_from(&q);
        assert!(p.covers(&q) && p.get(5));
        p.clear_from(&q);
        assert!(p.all(3, 4, false) && p.get(2) && p.get(7));
        assert!(p.all(128, 128, false) && !p.all(127, 2, false));
    }

    /// A fill of one bit (the inlined path) changes that bit and no other, at every position.
    #[test]
    fn single_bit_fills_change_that_bit_only() {
        // Under Miri, the positions at and around the words' edges and a few inside them.
        let positions =
            (0..FRAMES).filter(|i| !cfg!(miri) || i % 64 < 2 || i % 64 > 61 || i % 64 == 31);
        for i in positions {
            for (from, on) in [(Plane::FULL, false), (Plane::EMPTY, true)] {
                let mut p = from;
                p.fill(i, 1, on);
                for j in 0..FRAMES {
                    let want = if j == i { on } else { !on };
                    assert_eq!(p.get(j), want, "bit {j} after filling bit {i} with {on}");
                }
            }
        }
    }
}
