//! Teardown of a guest followed by a zeroed reallocation of the same memory, three ways: inline
//! zeroing on allocation, a background scrub on one thread between the two, and no zeroing (the
//! floor). A plain `memset` of the same memory in the same run is the yardstick for the
//! clearing throughput.
//!
//! The guest is backed by 2 MiB blocks and writes all of its memory (the first touch of the
//! simulated memory happens there, untimed), so every clear below hits resident memory.

use std::io;
use std::time::{Duration, Instant};

use numaframe::{AllocFlags, Machine, NodeId, Order, PAGE_SIZE, Pfn, PhysRange};
use serde::Serialize;

use super::OneNode;
use crate::sim::SimMemory;

/// How the reallocation gets zeroed memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Inline,
    Background,
    Floor,
}

/// One way's times.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct WayTimes {
    /// Freeing every block of the guest.
    pub teardown_ns: u128,
    /// The background scrub between teardown and reallocation (0 for the other ways).
    pub scrub_ns: u128,
    /// Allocating the same blocks again (with `ZERO`, except for the floor).
    pub realloc_ns: u128,
}

/// The experiment's result.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Teardown {
    /// Bytes of the guest.
    pub bytes: u64,
    /// Inline zeroing on allocation.
    pub inline: WayTimes,
    /// A background scrub on one thread, then a zeroed allocation of clean memory.
    pub background: WayTimes,
    /// No zeroing.
    pub floor: WayTimes,
    /// One `memset` of the guest's memory, same run, resident memory.
    pub memset_ns: u128,
    /// Clearing throughput of the scrub against the `memset`: `memset_ns / scrub_ns`.
    pub scrub_vs_memset: f64,
    /// The same for inline zeroing: `memset_ns / (inline realloc - floor realloc)`.
    pub inline_vs_memset: f64,
}

const ORDER: Order = Order::new(9);

/// Allocates every 2 MiB block it can from node 0.
fn take_all(m: &Machine<'_>, flags: AllocFlags) -> Vec<Pfn> {
    std::iter::from_fn(|| m.alloc(NodeId::new(0), ORDER, flags)).collect()
}

fn block(p: Pfn) -> io::Result<PhysRange> {
    PhysRange::new(p, Pfn::new(p.get() + ORDER.frames()))
        .ok_or_else(|| io::Error::other("a block past the end of physical memory"))
}

/// The owner of the blocks `blocks` writes `byte` over all of them, as a guest would. The one
/// unsafe call of the bench: the simulated memory cannot know who owns a frame.
#[allow(unsafe_code)]
fn owner_writes(mem: &SimMemory, blocks: &[Pfn], byte: u8) -> io::Result<()> {
    for &p in blocks {
        // SAFETY: every block of `blocks` was handed to this bench by the machine and is not
        // freed, so nothing else reads or writes it meanwhile.
        unsafe { mem.fill(block(p)?, byte) };
    }
    Ok(())
}

/// Also returns the guest's frames (the 2 MiB blocks the node handed out: a few fewer than
/// `frames` when its metadata pool takes a pageblock).
fn way(frames: u64, w: Way) -> io::Result<(WayTimes, u128, u64)> {
    let node = OneNode::exact(frames)?;
    let m = node.boot_zeroed()?;
    let mem = node.memory();
    let guest = take_all(&m, AllocFlags::empty());
    owner_writes(mem, &guest, 0x5a)?;
    let t = Instant::now();
    for &p in &guest {
        m.free(p, ORDER).map_err(io::Error::other)?;
    }
    let teardown = t.elapsed();
    let mut scrub = Duration::ZERO;
    if w == Way::Background {
        scrub = std::thread::scope(|s| {
            s.spawn(|| {
                let t = Instant::now();
                while m.scrub(NodeId::new(0), 1 << 16) > 0 {}
                t.elapsed()
            })
            .join()
        })
        .map_err(|_| io::Error::other("the scrub thread panicked"))?;
    }
    let flags = if w == Way::Floor {
        AllocFlags::empty()
    } else {
        AllocFlags::ZERO
    };
    let t = Instant::now();
    let again = take_all(&m, flags);
    let realloc = t.elapsed();
    if again.len() != guest.len() {
        return Err(io::Error::other(format!(
            "{w:?}: reallocated {} of {} blocks",
            again.len(),
            guest.len()
        )));
    }
    // Zeroed memory must read as zero: look at one word per frame.
    if w != Way::Floor {
        for &p in &again {
            for i in 0..ORDER.frames() {
                if mem.first_word(Pfn::new(p.get() + i)) != Some(0) {
                    return Err(io::Error::other(format!("{w:?}: frame {p} is not zero")));
                }
            }
        }
    }
    // The yardstick: one memset of the same (resident) memory.
    let t = Instant::now();
    owner_writes(mem, &again, 0)?;
    let memset = t.elapsed().as_nanos();
    Ok((
        WayTimes {
            teardown_ns: teardown.as_nanos(),
            scrub_ns: scrub.as_nanos(),
            realloc_ns: realloc.as_nanos(),
        },
        memset,
        guest.len() as u64 * ORDER.frames(),
    ))
}

/// Runs the three ways over a guest of `frames` frames.
///
/// # Errors
/// If a machine cannot be built, or the reallocation comes up short or not zeroed.
pub fn run(frames: u64) -> io::Result<Teardown> {
    let (inline, _, _) = way(frames, Way::Inline)?;
    let (background, memset_ns, guest) = way(frames, Way::Background)?;
    let (floor, _, _) = way(frames, Way::Floor)?;
    let ratio = |ns: u128| memset_ns as f64 / ns.max(1) as f64;
    Ok(Teardown {
        bytes: guest * PAGE_SIZE,
        inline,
        background,
        floor,
        memset_ns,
        scrub_vs_memset: ratio(background.scrub_ns),
        inline_vs_memset: ratio(inline.realloc_ns.saturating_sub(floor.realloc_ns)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Teardown::bytes` is documented as "Bytes of the guest"; the text prints it as "guest of
    /// N MiB" and the row's ns/op ("scrub per frame") divides the scrub by the same frame count.
    /// Independent count of the guest: the 2 MiB blocks a fresh node of the same size hands out
    /// (what `way` tears down, scrubs and reallocates).
    #[test]
    fn teardown_bytes_are_the_guests() {
        let frames = 1 << 19;
        let guest = {
            let node = OneNode::exact(frames).unwrap();
            let m = node.boot_zeroed().unwrap();
            take_all(&m, AllocFlags::empty()).len() as u64 * ORDER.frames() * PAGE_SIZE
        };
        let t = run(frames).unwrap();
        assert_eq!(
            t.bytes >> 20,
            guest >> 20,
            "MiB the result says the guest has vs MiB the guest was backed with"
        );
    }
}
