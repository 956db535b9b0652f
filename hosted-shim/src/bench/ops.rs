//! The timed operations the scenarios are made of, each generic over [`Frames`]: what one
//! call of a cell does and what it timed ([`Sample`]).
#![deny(unsafe_code)]

use std::hint::black_box;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use numaframe::policy::TaskPolicy;
use numaframe::{AllocFlags, BootOptions, Machine, NodeId, Order, Pfn};

use super::Frames;
use crate::sim::Sim;
use crate::spec::MachineSpec;

/// What one call of a cell measured: the timed part and the operations it contained.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Time of the timed part.
    pub time: Duration,
    /// Operations in it (pairs, frames, allocations + frees, boots: see the scenario).
    pub ops: u64,
}

/// `iters` alloc+free pairs of `order`.
pub fn pairs<A: Frames + ?Sized>(a: &mut A, order: u8, iters: u64) -> Sample {
    let start = Instant::now();
    for _ in 0..iters {
        let f = a.alloc(order).expect("a fresh allocator has a free block");
        a.free(black_box(f), order);
    }
    Sample {
        time: start.elapsed(),
        ops: iters,
    }
}

/// SplitMix64: a small, fast, seeded generator for the random free order.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n` > 0; the modulo bias is below 2^-40 for the sizes used here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// What a sample of [`fill_random_free`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timed {
    /// The fill and the frees; `ops` counts allocations and frees.
    Both,
    /// The frees alone (the fill is untimed setup); `ops` counts frees.
    Frees,
}

/// `iters` times: allocate order-0 frames until none is left, shuffle them (untimed), free them
/// in that order. `timed` says which part the sample times and counts.
pub fn fill_random_free<A: Frames + ?Sized>(
    a: &mut A,
    held: &mut Vec<u64>,
    rng: &mut Rng,
    iters: u64,
    timed: Timed,
) -> Sample {
    let mut s = Sample::default();
    for _ in 0..iters {
        held.clear();
        let start = Instant::now();
        while let Some(f) = a.alloc(0) {
            held.push(f);
        }
        if timed == Timed::Both {
            s.time += start.elapsed();
            s.ops += held.len() as u64;
        }
        rng.shuffle(held);
        let start = Instant::now();
        for &f in held.iter() {
            a.free(f, 0);
        }
        s.time += start.elapsed();
        s.ops += held.len() as u64;
    }
    s
}

/// LLFree's "rand" pattern on full memory (LLFree's own `rand` holds half of it; its `repeat`
/// allocates and frees one frame over and over): on the first call, allocates order-0 frames
/// until none is left into `held` (untimed); then `iters` times frees the frame at a random
/// index of `held` and allocates one into its place. `ops` counts free+allocation pairs (the
/// random index, a few ns, is inside the timed part).
pub fn repeat<A: Frames + ?Sized>(
    a: &mut A,
    held: &mut Vec<u64>,
    rng: &mut Rng,
    iters: u64,
) -> Sample {
    if held.is_empty() {
        while let Some(f) = a.alloc(0) {
            held.push(f);
        }
    }
    let start = Instant::now();
    for _ in 0..iters {
        let j = rng.below(held.len() as u64) as usize;
        a.free(held[j], 0);
        held[j] = a.alloc(0).expect("the frame just freed is free");
    }
    Sample {
        time: start.elapsed(),
        ops: iters,
    }
}

/// `iters` bulks of `out.len()` frames, timing the allocation (`time_alloc`) or the free;
/// `ops` counts frames.
pub fn bulk<A: Frames + ?Sized>(
    a: &mut A,
    out: &mut [Pfn],
    time_alloc: bool,
    iters: u64,
) -> Sample {
    let mut s = Sample::default();
    for _ in 0..iters {
        let start = Instant::now();
        let got = a.alloc_bulk(out);
        let mid = Instant::now();
        assert_eq!(got, out.len(), "a fresh allocator fills a bulk");
        black_box(&mut *out);
        a.free_bulk(out);
        let end = Instant::now();
        s.time += if time_alloc { mid - start } else { end - mid };
        s.ops += out.len() as u64;
    }
    s
}

/// `iters` order-0 alloc+free pairs on each handle, each on its own thread, all started at
/// once; the time is the wall time from the first start to the last end, `ops` all pairs.
///
/// The threads meet at a spinning barrier, so that all of them are running when the clock
/// starts (a parked thread on an idle virtual CPU can take milliseconds to wake).
pub fn pairs_threads<H: Frames + Send>(handles: &mut [H], iters: u64) -> Sample {
    let arrived = AtomicUsize::new(0);
    let n = handles.len();
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .iter_mut()
            .map(|h| {
                let arrived = &arrived;
                s.spawn(move || {
                    // Relaxed is enough: the counter only decides when to start the clock.
                    arrived.fetch_add(1, Ordering::Relaxed);
                    let mut spins = 0u32;
                    while arrived.load(Ordering::Relaxed) < n {
                        spins += 1;
                        if spins.is_multiple_of(4096) {
                            // Fewer cores than threads: let the others arrive.
                            std::thread::yield_now();
                        }
                        std::hint::spin_loop();
                    }
                    let start = Instant::now();
                    pairs(h, 0, iters);
                    (start, Instant::now())
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("a benchmark thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    Sample {
        time: end - start,
        ops: iters * n as u64,
    }
}

/// `iters` weighted-interleave allocations of `out.len()` pages (one bulk call, or one
/// `TaskPolicy::alloc` per page), freed untimed; `ops` counts pages.
pub fn interleave(
    machine: &Machine<'_>,
    policy: &mut TaskPolicy,
    out: &mut [Pfn],
    use_bulk: bool,
    iters: u64,
) -> Sample {
    let node0 = NodeId::new(0);
    let mut s = Sample::default();
    for _ in 0..iters {
        let start = Instant::now();
        if use_bulk {
            let r = policy.alloc_bulk(machine, node0, AllocFlags::empty(), out);
            assert_eq!(r.placed, out.len(), "the machine has room for the bulk");
        } else {
            for slot in out.iter_mut() {
                *slot = policy
                    .alloc(machine, node0, Order::ZERO, AllocFlags::empty())
                    .expect("the machine has room");
            }
        }
        s.time += start.elapsed();
        s.ops += out.len() as u64;
        machine
            .free_bulk(out)
            .expect("numaframe refused frames it handed out");
    }
    s
}

/// `iters` boots of `spec`, each over freshly mapped simulated memory (mapping not timed).
pub fn boot(spec: &MachineSpec, iters: u64) -> io::Result<Sample> {
    let mut s = Sample::default();
    for _ in 0..iters {
        let sim = Sim::new(spec)?;
        let start = Instant::now();
        let m = sim
            .boot(BootOptions::default())
            .map_err(|e| io::Error::other(format!("boot {}: {e}", spec.name())))?;
        s.time += start.elapsed();
        s.ops += 1;
        black_box(&m);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Floor, Padded};

    #[test]
    fn threads_count_every_pair() {
        let mut own: Vec<Padded<Floor>> = (0..2).map(|_| Padded(Floor::new(8))).collect();
        let s = pairs_threads(&mut own, 1000);
        assert_eq!(s.ops, 2000);
        assert!(own.iter().all(|f| f.0.free_frames() == 8));
    }
}
