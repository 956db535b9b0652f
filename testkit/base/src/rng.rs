//! The one pseudo-random generator of the tests.

/// xorshift64 (Marsaglia's shifts 13, 7, 17): a tiny seeded generator, so that every test that
/// draws numbers draws the same ones in every run and a failure reproduces from its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`. xorshift's state must not be zero (it would stay zero), so a zero
    /// seed is replaced by a fixed non-zero one; every other seed is the state as it is.
    pub const fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n`; 0 if `n` is 0. (The modulo bias is below `n / 2^64`, nothing for a test.)
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index into a slice of `len` elements: a number in `0..len`; 0 if `len` is 0.
    pub fn index(&mut self, len: usize) -> usize {
        // `usize` is at most 64 bits wide, so the value fits back.
        self.below(len as u64) as usize
    }

    /// `true` with probability `percent / 100`.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shifts, transcribed from Marsaglia's "Xorshift RNGs" (2003), one step by hand.
    fn step(x: u64) -> u64 {
        let x = x ^ (x << 13);
        let x = x ^ (x >> 7);
        x ^ (x << 17)
    }

    #[test]
    fn follows_the_xorshift64_recurrence() {
        // The first output from state 1, worked by hand: 0x2001, then 0x2041, then 0x4082_2041.
        assert_eq!(Rng::new(1).next_u64(), 0x4082_2041);
        let mut rng = Rng::new(1);
        let mut x = 1;
        for _ in 0..1000 {
            x = step(x);
            assert_eq!(rng.next_u64(), x);
        }
    }

    #[test]
    fn zero_seed_does_not_stick() {
        let mut rng = Rng::new(0);
        assert_ne!(rng.next_u64(), 0);
    }

    #[test]
    fn ranges_hold() {
        let mut rng = Rng::new(7);
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.index(0), 0);
        for n in 1..200 {
            assert!(rng.below(n) < n);
            assert!(rng.index(n as usize) < n as usize);
        }
        assert!((0..100).all(|_| !rng.chance(0)));
        assert!((0..100).all(|_| rng.chance(100)));
    }
}
