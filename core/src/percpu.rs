//! Per-CPU page caches: each CPU holds, for a few (node, zone, class) keys, one split pageblock
//! lent by its zone, and allocates and frees its order-0 frames without the zone lock.
//!
//! While a pageblock is lent, a state array in the CPU's own memory (one byte per frame) is the
//! truth for its frames. The owner pops a free frame from a private stack and marks it handed
//! out with a plain store (only the owner ever changes a free frame's byte); its own free of
//! such a frame is one compare-and-swap (handed out → free), which is also the cross-CPU
//! double-free check: every other free of a lent frame takes the zone lock and swaps the same
//! byte, so exactly one of two frees of a frame wins.
//!
//! Lending and giving back run under the zone lock, which every other access to a lent
//! pageblock also holds, so the state array and the zone's planes never disagree about who owns
//! what. Numastat events of cached traffic are counted per CPU and summed when numastat is read.
//!
//! A CPU's cache is reached in one of two ways. Through its lock (`Shared`), one operation at
//! a time, by the locked API (`Machine::alloc_cpu`, `free_cpu`). Or through a claim
//! (`Owned`, behind [`CpuHandle`](crate::CpuHandle)): one atomic sets the cache's `CLAIMED`
//! bit, the claim then takes the cache lock and holds it until the handle drops, so the
//! handle's operations take no lock at all. While a handle holds a cache, the locked API of its CPU goes around the cache
//! (allocations straight from the zones, frees under the zone lock, as another CPU's would),
//! and remote drains post a `REQUEST` bit instead of waiting for a lock that may never be given
//! up. The request and the claim are bits of one atomic, so a drain either sees the claim (and
//! the handle, at the latest when it drops, sees the request) or sees it gone and drains
//! directly. The handle honours a request before each operation (one plain load when there is
//! none) by giving back every pageblock, and reads the tuning again then.
//!
//! A handle's bulk free of frames of its own pageblocks takes the lock of their zone instead
//! (of each of their zones, in ascending order, as `Machine::free_bulk` does): every other
//! writer of those bytes holds it, so the bulk checks and frees each frame with a load and a
//! store, and a refused bulk puts the bytes back before anyone can see them.
//!
//! Two promises need care with concurrency:
//! - *Turning caching off is a barrier.* Every operation reads the tuning under its cache lock
//!   or claim (a handle when it is claimed and when it honours a request), and
//!   [`Machine::set_pcp`](crate::Machine::set_pcp) gives back every unclaimed cache's
//!   pageblocks (taking each lock) after storing it, so when it returns no unclaimed CPU
//!   holds one and none will. A claimed CPU gives its pageblocks back at its next operation, or
//!   when its handle drops, whichever comes first, and takes none after that.
//! - *Cached frames do not make an allocation fail*, with one exception. A walk that failed
//!   raises the caches' pressure count before it makes every CPU give back the pageblocks its
//!   walk could use, and retries; while pressure is raised no CPU takes a new pageblock. A walk
//!   of a handle posts the request to itself and honours it in its own retry. But the frames
//!   cached on *another* claimed CPU come back only at that CPU's next operation, poll or drop:
//!   a failing walk does not wait for it (the handle may be idle, or held by the failing
//!   thread). So an allocation may fail while up to four pageblocks stay cached on each idle
//!   claimed CPU. A platform's [`CpuKick`] shortens that: each request posted to a claimed CPU
//!   whose cache holds a pageblock (but the walking handle's own) wakes it to poll, as Linux's
//!   `drain_all_pages` interrupts the CPUs with pages on their lists (the `HOLDS` bit: see
//!   `Owned::publish_holds`).
//!
//! `cached_pages` and the invariant check read unclaimed caches only: a claimed CPU's cached
//! frames are left out until its handle drops. Numastat reads every cache's event lines
//! without its lock (one writer at a time adds with a load and a store), so it never goes
//! down; a handle's hits since its claim arrive when it drops.
//!
//! Lock order: a CPU's cache lock (held by a handle for its whole life), then one zone lock
//! (see `sync`).
#![deny(unsafe_code)]

use core::fmt;

use crate::addr::{Order, Pfn, PhysRange};
use crate::bitmap::{FRAMES, Plane};
use crate::buddy::{Got, HotFrames, LEND_MIN, Lent, NoBlock};
use crate::error::{BulkFreeError, ClaimError, FreeError, InvariantError};
use crate::meta::{Class, PbRef};
use crate::node::{
    Level, Mark, Node, Nodes, Zone, ZoneFamily, ZoneKind, ZoneSet, count_foreign, zone_index,
};
use crate::platform::Poison;
use crate::stats::{Event, NumaStat, OwnEvents, tally};
use crate::sync::{
    AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, spin_loop,
};
use crate::topology::NodeId;

/// The most frames a tuning counts: a whole pageblock.
pub const MAX_BATCH: u32 = FRAMES as u32;

/// Pageblocks one CPU can hold at once (one per (node, zone, class) it allocates from).
pub(crate) const SLOTS: usize = 4;

/// A CPU registered at boot. Get one from [`Machine::cpu`](crate::Machine::cpu).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CpuId(u32);

impl CpuId {
    /// The CPU's index, as registered at boot.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for CpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu{}", self.0)
    }
}

/// How the platform wakes a CPU whose cache a [`CpuHandle`](crate::CpuHandle) holds, when a
/// drain asks that cache for its pageblocks back (memory pressure, `drain_cpu`, `drain_all`,
/// `set_pcp`, offlining): Linux sends such a CPU an interrupt (`drain_all_pages`).
///
/// Without one, a claimed cache gives its pageblocks back at its handle's next operation or
/// drop, so a CPU that idles with its handle alive strands them: an allocation elsewhere may
/// fail, and an offline of their memory is refused as busy, until that CPU runs again. With
/// one, the core calls [`kick`](CpuKick::kick) once for each request it posts to a claimed
/// CPU whose cache holds a pageblock (not again while that request waits, never for the CPU
/// whose own handle runs the failing walk, and not for a cache with nothing to give back, as
/// Linux interrupts only CPUs with pages on their lists), and the platform makes that CPU call
/// [`CpuHandle::poll`](crate::CpuHandle::poll)
/// soon: an inter-processor interrupt whose handler marks a poll due at the CPU's next safe
/// point, or waking the thread that owns the handle. A failing allocation does not wait for
/// the kicked CPUs: its caller tries again once they polled.
///
/// The core calls it with no zone lock held and no cache lock but, when a handle's own walk
/// drains, that handle's (which it holds for its whole life), and with the hotplug lock during
/// an offline; from any CPU, hence `Sync`. It must not call into the machine, and must not
/// wait for the kicked CPU.
pub trait CpuKick: Sync {
    /// Asks the owner of `cpu`'s handle to call [`CpuHandle::poll`](crate::CpuHandle::poll).
    fn kick(&self, cpu: CpuId);
}

/// Cache tuning. A CPU takes the fullest pageblock with at least `batch` free frames (the
/// fullest with any when none has that many; one with fewer than 16, or `high` if smaller, is
/// not lent, and a frame of it is handed out directly), and gives a pageblock back when its own
/// frees leave more than `high` frames free in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcpConfig {
    /// Fewest free frames a pageblock should bring, `1..=MAX_BATCH`.
    pub batch: u32,
    /// Most free frames a CPU keeps in one pageblock, at least `batch`; 0 turns caching off.
    pub high: u32,
}

impl Default for PcpConfig {
    /// The fullest pageblock, kept until it is wholly free.
    fn default() -> Self {
        Self {
            batch: 1,
            high: MAX_BATCH,
        }
    }
}

impl PcpConfig {
    /// Caching off: every order-0 request goes to its zone.
    pub const OFF: PcpConfig = PcpConfig { batch: 1, high: 0 };

    /// The config with `batch` clamped to `1..=MAX_BATCH` and `high` to `batch..=MAX_BATCH`
    /// (unless it is 0).
    pub fn clamped(self) -> PcpConfig {
        let batch = self.batch.clamp(1, MAX_BATCH);
        let high = if self.high == 0 {
            0
        } else {
            self.high.clamp(batch, MAX_BATCH)
        };
        PcpConfig { batch, high }
    }

    fn pack(self) -> u64 {
        u64::from(self.high) << 32 | u64::from(self.batch)
    }

    fn unpack(v: u64) -> PcpConfig {
        PcpConfig {
            batch: v as u32,
            high: (v >> 32) as u32,
        }
    }
}

/// Byte states of a lent pageblock's frames.
mod state {
    pub(super) const FREE_CLEAN: u8 = 0;
    pub(super) const FREE_DIRTY: u8 = 1;
    /// Inside an allocated block of order 1 or more (its head holds the order).
    pub(super) const INTERIOR: u8 = 2;
    /// Outside the span: never free.
    pub(super) const OUTSIDE: u8 = 3;
    /// Handed out, and claimed by a bulk free in progress.
    pub(super) const CLAIMED: u8 = 4;
    /// Handed out: the head of a block of `state & ORDER`.
    pub(super) const HELD: u8 = 0x80;
    pub(super) const ORDER: u8 = 0x0f;

    pub(super) fn is_free(s: u8) -> bool {
        s <= FREE_DIRTY
    }
}

/// Eight nodes' numastat events in 384 bytes, on cache lines of their own. One writer at a
/// time (the holder of the CPU's cache lock or claim) adds with a load and a store; numastat
/// reads them without the lock, so a claimed CPU's past events stay visible.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct EventLines([[AtomicU64; 6]; 8]);

impl EventLines {
    pub(crate) fn new() -> EventLines {
        EventLines(core::array::from_fn(|_| {
            core::array::from_fn(|_| AtomicU64::new(0))
        }))
    }
}

/// Adds `n` to a counter of [`EventLines`] (its single writer holds the cache).
fn bump(c: &AtomicU64, n: u64) {
    // Relaxed: an event count orders nothing; only the cache's holder writes it.
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// Blocks of eight needed for `slots` entries.
pub(crate) fn lines_for(slots: usize) -> usize {
    slots.div_ceil(8)
}

/// Where a frame lives, found without a lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastSpan {
    pub(crate) range: PhysRange,
    pub(crate) node: NodeId,
    pub(crate) zone: ZoneKind,
}

/// The part of a slot other CPUs touch (under the lent pageblock's zone lock): the state
/// array, and how many frames they freed in it since the owner last looked.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct SlotStates {
    states: [AtomicU8; FRAMES],
    remote: AtomicU32,
}

impl SlotStates {
    pub(crate) fn new() -> Self {
        Self {
            states: core::array::from_fn(|_| AtomicU8::new(state::OUTSIDE)),
            remote: AtomicU32::new(0),
        }
    }
}

/// What a slot caches for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    node: NodeId,
    zone: ZoneKind,
    class: Class,
}

/// The owner's side of a slot.
#[derive(Debug)]
struct Slot {
    key: Option<Key>,
    r: PbRef,
    base: Pfn,
    /// The pageblock's frames inside its span, as offsets `lo..hi`: the frames outside may
    /// belong to another span (of this zone or another), whose frees must go there. An empty
    /// slot (no key) has `lo == hi`, so it holds no frame.
    lo: usize,
    hi: usize,
    /// Offsets of frames known free in the state array (remote frees are found by a rescan).
    stack: [u16; FRAMES],
    len: usize,
    /// The pageblock has an extra plane (so heads and dirty frames are told apart on return).
    extra: bool,
    /// When the slot was last used, for choosing one to give back.
    used: u64,
}

impl Slot {
    const EMPTY: Slot = Slot {
        key: None,
        r: PbRef { span: 0, index: 0 },
        base: Pfn::new(0),
        lo: 0,
        hi: 0,
        stack: [0; FRAMES],
        len: 0,
        extra: false,
        used: 0,
    };

    /// The offset of `pfn` if it is one of the slot's frames inside its span. A frame below
    /// the base wraps to an offset far above `hi`.
    #[inline]
    fn holds(&self, pfn: Pfn) -> Option<usize> {
        let off = pfn.get().wrapping_sub(self.base.get());
        (off >= self.lo as u64 && off < self.hi as u64).then_some(off as usize)
    }

    /// Pushes a frame this CPU just freed onto the stack. The stack is full only if an
    /// unchecked free broke its contract: the frame then waits in the array for the next
    /// rescan.
    #[inline]
    fn push(&mut self, off: usize) {
        if let Some(top) = self.stack.get_mut(self.len) {
            *top = off as u16;
            self.len += 1;
        }
    }
}

/// The state behind one CPU's lock.
#[derive(Debug)]
struct CpuCache<'a> {
    slots: [Slot; SLOTS],
    /// Numastat events this CPU counted, per node, eight to a block.
    events: &'a [EventLines],
    /// The span this CPU freed into last: frees mostly hit it, and then need no lookup.
    last: Option<LastSpan>,
    clock: u64,
    /// Local hits a handle's hot paths counted, not yet in `events` (which nothing reads
    /// while a handle holds the cache); 0 whenever no handle does.
    hits: u64,
}

impl CpuCache<'_> {
    /// The slot holding `pfn` and its offset there.
    #[inline]
    fn find(&self, pfn: Pfn) -> Option<(usize, usize)> {
        (0..SLOTS).find_map(|i| Some((i, self.slots[i].holds(pfn)?)))
    }
}

/// A CPU's cache, its state arrays and its node, on cache lines of their own.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct PerCpu<'a> {
    node: NodeId,
    states: &'a [SlotStates],
    /// The cache's numastat events, read without its lock.
    events: &'a [EventLines],
    cache: Mutex<CpuCache<'a>>,
    /// [`claim`] bits: whether a handle holds `cache`, and whether a drain waits for it.
    flags: AtomicU8,
}

impl<'a> PerCpu<'a> {
    pub(crate) fn new(node: NodeId, states: &'a [SlotStates], events: &'a [EventLines]) -> Self {
        Self {
            node,
            states,
            events,
            cache: Mutex::new(CpuCache {
                slots: [const { Slot::EMPTY }; SLOTS],
                events,
                last: None,
                clock: 0,
                hits: 0,
            }),
            flags: AtomicU8::new(0),
        }
    }
}

/// Who asked for a cached allocation, for numastat.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asker {
    /// The node numastat takes as preferred: the first node of the walk the request may use
    /// (see `Machine::counted`).
    pub(crate) preferred: NodeId,
    pub(crate) interleave: bool,
}

/// What a CPU's allocation asks of one zone.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Want<'n> {
    pub(crate) node: &'n Node,
    pub(crate) kind: ZoneKind,
    /// The watermark the zone must keep.
    pub(crate) mark: Mark,
    pub(crate) class: Class,
    pub(crate) asker: Asker,
}

fn count(events: &[EventLines], cpu_node: NodeId, preferred: NodeId, got: NodeId, il: bool) {
    tally(cpu_node, preferred, got, 1, il, |node, event, n| {
        if let Some(e) = events.get(node.index() / 8) {
            bump(&e.0[node.index() % 8][event.index()], n);
        }
    });
}

/// Counts what [`count`] counts for `n` allocations that preferred and got the CPU's own
/// node, not interleaved: hits, local.
fn count_local(events: &[EventLines], node: NodeId, n: u64) {
    if let Some(e) = events.get(node.index() / 8) {
        let e = &e.0[node.index() % 8];
        bump(&e[Event::Hit.index()], n);
        bump(&e[Event::Local.index()], n);
    }
}

/// Fills `states` and the slot's stack from a pageblock the zone lends: runs under the zone
/// lock, before anyone else can see the pageblock lent.
fn take_in(slot: &mut Slot, states: &SlotStates, lent: &Lent, key: Key) {
    slot.key = Some(key);
    slot.r = lent.r;
    slot.base = lent.base;
    slot.lo = lent.lo;
    slot.hi = lent.hi;
    slot.extra = lent.extra.is_some();
    slot.len = 0;
    let mut i = 0;
    while i < FRAMES {
        let (s, len) = if i < lent.lo || i >= lent.hi {
            (state::OUTSIDE, 1)
        } else if !lent.alloc.get(i) {
            let dirty = lent.extra.map_or(lent.dirty, |x| x.get(i));
            slot.stack[slot.len] = i as u16;
            slot.len += 1;
            (
                if dirty {
                    state::FREE_DIRTY
                } else {
                    state::FREE_CLEAN
                },
                1,
            )
        } else if let Some(x) = lent.extra {
            // A head: its block runs to the next head or free frame.
            let mut len = 1;
            while i + len < FRAMES && lent.alloc.get(i + len) && !x.get(i + len) {
                len += 1;
            }
            for k in 1..len {
                // Relaxed: the zone lock held by the caller orders the array before any use.
                states.states[i + k].store(state::INTERIOR, Ordering::Relaxed);
            }
            (state::HELD | len.trailing_zeros() as u8, len)
        } else {
            (state::HELD, 1)
        };
        // Relaxed: as above.
        states.states[i].store(s, Ordering::Relaxed);
        i += len;
    }
    // Relaxed: as above.
    states.remote.store(0, Ordering::Relaxed);
    // Reversed, so the lowest offsets come first.
    slot.stack[..slot.len].reverse();
}

/// Builds the planes a pageblock goes back to its zone with: runs under the zone lock.
fn planes_of(states: &SlotStates) -> (Plane, Plane, bool) {
    let (mut alloc, mut extra, mut dirty) = (Plane::EMPTY, Plane::EMPTY, false);
    for i in 0..FRAMES {
        // Relaxed: the zone lock orders every other writer's swap against this read.
        let s = states.states[i].load(Ordering::Relaxed);
        match s {
            state::FREE_CLEAN => {}
            state::FREE_DIRTY => {
                extra.put(i, true);
                dirty = true;
            }
            state::INTERIOR => alloc.put(i, true),
            _ => {
                alloc.put(i, true);
                extra.put(i, true);
            }
        }
    }
    (alloc, extra, dirty)
}

/// Bits of [`PerCpu::flags`].
mod claim {
    /// A handle holds the cache (it holds the cache lock for as long as it lives).
    pub(super) const CLAIMED: u8 = 1;
    /// A remote drain asked the handle to give back every pageblock.
    pub(super) const REQUEST: u8 = 2;
    /// Memory went offline: the handle forgets the span it freed into last, which may be gone.
    pub(super) const FORGET: u8 = 4;
    /// The claimed cache may hold a pageblock: a drain request wakes the CPU only then (as
    /// Linux interrupts only CPUs with pages on their lists). Set by the claim, cleared by the
    /// owner once its cache holds none, and set again by the owner's refill before that
    /// operation honours a request (see [`Owned::publish_holds`]).
    pub(super) const HOLDS: u8 = 8;
}

/// Every CPU's cache, the tuning they share, the pressure flag, and how to wake a claimed CPU.
#[derive(Debug)]
pub(crate) struct Caches<'a> {
    cpus: &'a [&'a PerCpu<'a>],
    /// [`PcpConfig::pack`]ed: batch and high are set and read together.
    tuning: AtomicU64,
    /// Walks that drained the caches and are retrying; see the module doc.
    pressure: AtomicUsize,
    /// The platform's way to wake a claimed CPU a drain request was posted to.
    kick: Option<Kick<'a>>,
}

/// A [`CpuKick`], shown by [`Caches`]'s `Debug` without its contents.
#[derive(Clone, Copy)]
struct Kick<'a>(&'a dyn CpuKick);

impl fmt::Debug for Kick<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Kick")
    }
}

/// A CPU's way into its cache: through its lock ([`Shared`]) or through a claim ([`Owned`]).
pub(crate) trait CacheAccess {
    /// Pops a free frame of the pageblock the CPU holds for (node, zone, class), if it has one,
    /// counting the event, and says whether it may be dirty. Takes no zone lock.
    fn pop(&mut self, node: NodeId, zone: &Zone, class: Class, asker: Asker)
    -> Option<(Pfn, bool)>;

    /// Takes an order-0 frame of `want`'s zone: from the CPU's pageblock, else from a new
    /// pageblock its zone lends above the mark, else (caching off, under pressure, or from
    /// the reserves) one frame straight from the zone. Counts the event. `zero` prefers a
    /// clean frame where the zone picks it.
    fn take(&mut self, want: &Want<'_>, nodes: Nodes<'_>, zero: bool) -> Result<Got, NoBlock>;
}

/// A CPU's cache reached through its lock, one operation at a time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shared<'m, 'a> {
    pub(crate) caches: &'m Caches<'a>,
    pub(crate) cpu: CpuId,
}

impl CacheAccess for Shared<'_, '_> {
    #[inline]
    fn pop(
        &mut self,
        node: NodeId,
        zone: &Zone,
        class: Class,
        asker: Asker,
    ) -> Option<(Pfn, bool)> {
        let pc = self.caches.cpus.get(self.cpu.index())?;
        let mut c = lock_unclaimed(pc)?;
        let key = Key {
            node,
            zone: zone.kind(),
            class,
        };
        pop_key(pc, &mut c, key, asker)
    }

    fn take(&mut self, want: &Want<'_>, nodes: Nodes<'_>, zero: bool) -> Result<Got, NoBlock> {
        let pc = self
            .caches
            .cpus
            .get(self.cpu.index())
            .ok_or(NoBlock::Empty)?;
        match lock_unclaimed(pc) {
            Some(mut c) => self.caches.take_at(self.cpu, pc, &mut c, want, nodes, zero),
            None => {
                // A handle holds the cache: straight from the zone, counted there (and a
                // fallback in the preferred node's `numa_foreign`).
                let (got, preferred) = (want.node.id(), want.asker.preferred);
                let events = OwnEvents::of(pc.node, preferred, got, want.asker.interleave);
                let block = want.node.zone(want.kind).alloc(
                    Order::ZERO,
                    want.mark,
                    want.class,
                    zero,
                    Some(events),
                )?;
                count_foreign(nodes, preferred, got, 1);
                Ok(block)
            }
        }
    }
}

/// The cache of a CPU that no handle holds, locked; `None` if a handle holds it.
fn lock_unclaimed<'c, 'a>(pc: &'c PerCpu<'a>) -> Option<MutexGuard<'c, CpuCache<'a>>> {
    loop {
        if let Some(c) = pc.cache.try_lock() {
            return Some(c);
        }
        // Relaxed: this only decides whether to wait; the lock orders the cache's contents.
        if pc.flags.load(Ordering::Relaxed) & claim::CLAIMED != 0 {
            return None;
        }
        spin_loop();
    }
}

/// Pops a frame for `key` from the CPU's slots, counting the event.
fn pop_key(pc: &PerCpu<'_>, c: &mut CpuCache<'_>, key: Key, asker: Asker) -> Option<(Pfn, bool)> {
    let i = c.slots.iter().position(|s| s.key == Some(key))?;
    let pfn = pop_slot(&mut c.slots[i], &pc.states[i])?;
    c.clock += 1;
    c.slots[i].used = c.clock;
    count(
        c.events,
        pc.node,
        asker.preferred,
        key.node,
        asker.interleave,
    );
    Some(pfn)
}

/// Takes a free frame off a slot: from its stack, else from frames others freed into it;
/// `true` with it if it may be dirty.
#[inline]
fn pop_slot(slot: &mut Slot, states: &SlotStates) -> Option<(Pfn, bool)> {
    pop_slot_with(slot, states, hand_out)
}

/// [`pop_slot`], marking the frame handed out with `mark`.
#[inline]
fn pop_slot_with(
    slot: &mut Slot,
    states: &SlotStates,
    mark: impl FnOnce(&AtomicU8) -> bool,
) -> Option<(Pfn, bool)> {
    if slot.len == 0 && !rescan(slot, states) {
        return None;
    }
    slot.len = slot.len.checked_sub(1)?;
    let off = usize::from(*slot.stack.get(slot.len)?);
    let dirty = mark(states.states.get(off)?);
    Some((Pfn::new(slot.base.get() + off as u64), dirty))
}

/// Marks a free frame of the CPU's own pageblock handed out; `true` if it may be dirty.
///
/// Only the owner changes a free frame's byte (remote frees and bulk claims swap handed-out
/// bytes only), so a load and a plain store do what a swap would, without a locked
/// instruction. Relaxed: the frame's contents are ordered by whoever hands the frame to its
/// next user, and a free of it from then on (which that user's hand-over orders after this
/// store) swaps it back.
#[inline]
fn hand_out(byte: &AtomicU8) -> bool {
    let was = byte.load(Ordering::Relaxed);
    byte.store(state::HELD, Ordering::Relaxed);
    was != state::FREE_CLEAN
}

/// [`hand_out`] on a handle's hot paths, which serve no request for zeroed frames: their
/// callers need the frame's dirty state only for the `poison` debug mode's check. Other builds
/// skip the load and say the frame may be dirty. The load is not free: right after the
/// owner's free of the same frame it waits for that free's compare-and-swap to complete, which
/// measured about 4 ns of a hot pair.
#[inline]
fn hand_out_hot(byte: &AtomicU8) -> bool {
    if cfg!(feature = "poison") {
        return hand_out(byte);
    }
    // Relaxed: as in `hand_out`.
    byte.store(state::HELD, Ordering::Relaxed);
    true
}

/// Refills an empty stack with the frames others freed into the slot since the last rescan;
/// `false` if there are none.
#[cold]
fn rescan(slot: &mut Slot, states: &SlotStates) -> bool {
    // Relaxed: the swaps of remote frees are read below with Acquire.
    if states.remote.swap(0, Ordering::Relaxed) == 0 {
        return false;
    }
    // The stack is empty, so every free byte is one that others freed.
    for i in 0..FRAMES {
        // Acquire: pairs with the Release of a remote free's swap, so the frame is handed
        // out after its last owner's writes.
        if state::is_free(states.states[i].load(Ordering::Acquire)) {
            slot.push(i);
        }
    }
    slot.len != 0
}

/// Gives a slot's pageblock back to its zone.
fn give_back(slot: &mut Slot, states: &SlotStates, nodes: Nodes<'_>) {
    let Some(key) = slot.key.take() else {
        return;
    };
    (slot.lo, slot.hi, slot.len) = (0, 0, 0);
    let Some(node) = nodes.get(key.node.index()) else {
        return;
    };
    node.zone(key.zone).take_back(slot.r, || planes_of(states));
}

/// Gives back the pageblocks of the (node, zone) pairs `wanted` accepts; returns how many
/// free frames they had.
fn drain_slots(
    pc: &PerCpu<'_>,
    c: &mut CpuCache<'_>,
    nodes: Nodes<'_>,
    wanted: impl Fn(NodeId, ZoneKind) -> bool,
) -> u64 {
    let mut frames = 0;
    for i in 0..SLOTS {
        if let Some(k) = c.slots[i].key
            && wanted(k.node, k.zone)
        {
            frames += free_frames(&pc.states[i]);
            give_back(&mut c.slots[i], &pc.states[i], nodes);
        }
    }
    frames
}

/// Frees an order-0 frame of the CPU's own slot, at `off`, into its stack: one swap of its
/// byte (handed out → free), or with `unchecked` a store. A frame freed dirty is then filled
/// through `poison`.
#[inline]
fn free_own(
    slot: &mut Slot,
    states: &SlotStates,
    off: usize,
    pfn: Pfn,
    dirty: bool,
    unchecked: bool,
    poison: Poison<'_>,
) -> Result<(), FreeError> {
    let byte = states.states.get(off).ok_or(FreeError::Foreign { pfn })?;
    loop {
        match mark_freed(byte, dirty, unchecked) {
            Ok(()) => break,
            // A bulk free or a remote poisoning free holds the frame claimed, under its zone
            // lock, for a moment: it frees it (then this free loses) or gives it back if it is
            // refused (then this free is the only one and must win).
            Err(state::CLAIMED) => crate::sync::spin_loop(),
            Err(found) => return Err(misuse(found, pfn, 0)),
        }
    }
    if dirty && poison.on() {
        // The `poison` debug mode fills the frame once this free has won it: a double free is
        // refused before it touches the frame. The frame is free now, but only this CPU, busy
        // here, can hand it out again, and every other free of it is refused untouched.
        poison.fill(pfn, 1);
    }
    slot.push(off);
    Ok(())
}

/// Marks a frame of the CPU's own pageblock free (`dirty` or not) if it is handed out; else
/// `Err` with the state found, the byte unchanged. With `unchecked` a store: the caller
/// guarantees the frame is handed out and that no other free of it runs, so no other writer
/// races it.
#[inline]
fn mark_freed(byte: &AtomicU8, dirty: bool, unchecked: bool) -> Result<(), u8> {
    if unchecked {
        // Release: as below.
        byte.store(freed(dirty), Ordering::Release);
        return Ok(());
    }
    byte.compare_exchange(
        state::HELD,
        freed(dirty),
        // AcqRel: the winner of two frees of one frame is decided here; Release orders the
        // frame's last writes before its next allocation.
        Ordering::AcqRel,
        Ordering::Acquire,
    )
    .map(|_| ())
}

/// The zone a frame outside the CPU's pageblocks goes back to, found through the span the CPU
/// freed into last (or `locate`, which then replaces it).
fn zone_of<'n>(
    c: &mut CpuCache<'_>,
    pfn: Pfn,
    nodes: Nodes<'n>,
    locate: impl FnOnce(Pfn) -> Option<LastSpan>,
) -> Result<&'n Zone, FreeError> {
    if !c.last.as_ref().is_some_and(|l| l.range.contains(pfn)) {
        c.last = Some(locate(pfn).ok_or(FreeError::Foreign { pfn })?);
    }
    let last = c.last.ok_or(FreeError::Foreign { pfn })?;
    Ok(nodes
        .get(last.node.index())
        .ok_or(FreeError::Foreign { pfn })?
        .zone(last.zone))
}

impl<'a> Caches<'a> {
    pub(crate) fn new(cpus: &'a [&'a PerCpu<'a>], config: PcpConfig) -> Self {
        Self {
            cpus,
            tuning: AtomicU64::new(config.clamped().pack()),
            pressure: AtomicUsize::new(0),
            kick: None,
        }
    }

    /// Wakes claimed CPUs through `kick` when a drain request is posted to them while their
    /// caches hold a pageblock.
    pub(crate) fn set_kick(&mut self, kick: &'a dyn CpuKick) {
        self.kick = Some(Kick(kick));
    }

    /// Posts `bit` to the flags of `cpu`'s cache `pc`; `true` if a handle holds the cache (it
    /// honours the bit before its next operation or when it drops). With `kick`, a drain
    /// request posted to a claimed cache that had none waiting and whose `HOLDS` bit is set
    /// (see `Owned::publish_holds`) wakes the CPU through the platform's [`CpuKick`].
    fn post(&self, cpu: CpuId, pc: &PerCpu<'_>, bit: u8, kick: bool) -> bool {
        // Release: the tuning, pressure or layout stored before the bit is seen by the handle
        // once its Acquire load finds it. The bit is in the same atomic as the claim, so either
        // this sees the claim (and the handle, at the latest when it drops, sees the bit) or
        // the handle is gone and the caller tries the lock again.
        let was = pc.flags.fetch_or(bit, Ordering::Release);
        if was & claim::CLAIMED == 0 {
            return false;
        }
        if kick
            && bit & claim::REQUEST != 0
            && was & (claim::REQUEST | claim::HOLDS) == claim::HOLDS
            && let Some(k) = self.kick
        {
            k.0.kick(cpu);
        }
        true
    }

    /// The CPU registered with index `index`.
    pub(crate) fn cpu(&self, index: usize) -> Option<CpuId> {
        (index < self.cpus.len()).then_some(CpuId(index as u32))
    }

    /// Number of CPUs.
    pub(crate) fn len(&self) -> usize {
        self.cpus.len()
    }

    /// The node of a CPU.
    pub(crate) fn node_of(&self, cpu: CpuId) -> Option<NodeId> {
        self.cpus.get(cpu.index()).map(|c| c.node)
    }

    /// The tuning in force.
    pub(crate) fn tuning(&self) -> PcpConfig {
        // Relaxed: one value; operations read it again under their cache lock.
        PcpConfig::unpack(self.tuning.load(Ordering::Relaxed))
    }

    /// The tuning if caches may take pageblocks now (caching on, no walk retrying under
    /// pressure). Read under a cache lock or claim, so that `set_tuning` and a pressure drain,
    /// which drain every cache (or post a request its handle honours first) after changing
    /// these, order against it.
    fn caching(&self) -> Option<PcpConfig> {
        // Relaxed: ordered by the cache lock held by the caller, or by the Acquire load of a
        // claimed cache's request (see the module doc).
        let c = PcpConfig::unpack(self.tuning.load(Ordering::Relaxed));
        (c.high != 0 && self.pressure.load(Ordering::Relaxed) == 0).then_some(c)
    }

    /// `true` while caching is turned off (`PcpConfig::OFF`, or any tuning with `high` 0), read
    /// with no lock held: a hint for skipping a cache that can only hold what the slow paths
    /// find as well.
    #[inline]
    pub(crate) fn off(&self) -> bool {
        // Relaxed: a hint (see above). `high` is the tuning's upper half (`PcpConfig::pack`).
        self.tuning.load(Ordering::Relaxed) >> 32 == 0
    }

    /// Replaces the tuning and gives back every pageblock of every unclaimed cache, and asks
    /// every handle to give back its own before its next operation.
    pub(crate) fn set_tuning(&self, config: PcpConfig, nodes: Nodes<'_>) {
        // Relaxed: each cache lock taken by the drain below, or the Release of a request it
        // posts, orders this store before every operation that runs after it on that cache.
        self.tuning
            .store(config.clamped().pack(), Ordering::Relaxed);
        for i in 0..self.cpus.len() {
            self.drain_cpu(CpuId(i as u32), nodes, |_, _| true);
        }
    }

    /// Claims `cpu`'s cache for a handle: it holds the cache lock until it drops.
    ///
    /// # Errors
    /// [`ClaimError::UnknownCpu`], or [`ClaimError::Claimed`] while another handle lives.
    pub(crate) fn claim<'m>(
        &'m self,
        cpu: CpuId,
        nodes: Nodes<'m>,
    ) -> Result<Owned<'m, 'a>, ClaimError> {
        let pc = self
            .cpus
            .get(cpu.index())
            .ok_or(ClaimError::UnknownCpu { cpu: cpu.0 })?;
        // Only one claim can set the bit. It clears a request or note left by a drain that
        // posted it after the last handle dropped: that drain found the claim gone and does
        // its work under the cache lock itself, or finds this claim and posts again (after
        // this, so the bit it sets is new and kicks the CPU if its cache holds a pageblock).
        // A stale bit would pass for a request this CPU was kicked for, and the next one would
        // wake nobody. Relaxed: the cache lock taken next orders the cache's contents.
        let mut was = pc.flags.load(Ordering::Relaxed);
        loop {
            if was & claim::CLAIMED != 0 {
                return Err(ClaimError::Claimed { cpu: cpu.0 });
            }
            // Holding until the handle looks: a request meanwhile kicks it, which is safe.
            let now = (was | claim::CLAIMED | claim::HOLDS) & !(claim::REQUEST | claim::FORGET);
            match pc
                .flags
                .compare_exchange(was, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(found) => was = found,
            }
        }
        // A remote drain or an operation of the locked API may hold the lock for a moment.
        let c = pc.cache.lock();
        let mut owned = Owned {
            caches: self,
            pc,
            nodes,
            cpu,
            c,
            asking: None,
            hot: None,
            // Read under the lock: a `set_tuning` that drained this cache before the claim
            // took it stored its tuning before that drain.
            high: self.tuning().high as usize,
            holds: true,
        };
        owned.publish_holds();
        Ok(owned)
    }

    /// Takes an order-0 frame for `cpu`, whose cache `c` is: see [`CacheAccess::take`].
    fn take_at(
        &self,
        cpu: CpuId,
        pc: &PerCpu<'_>,
        c: &mut CpuCache<'_>,
        want: &Want<'_>,
        nodes: Nodes<'_>,
        zero: bool,
    ) -> Result<Got, NoBlock> {
        let Want {
            node,
            kind,
            mark,
            class,
            asker,
        } = *want;
        let zone = node.zone(kind);
        let key = Key {
            node: node.id(),
            zone: kind,
            class,
        };
        let held = c.slots.iter().position(|s| s.key == Some(key));
        if let Some(i) = held
            && let Some((pfn, dirty)) = pop_slot(&mut c.slots[i], &pc.states[i])
        {
            count(
                c.events,
                pc.node,
                asker.preferred,
                node.id(),
                asker.interleave,
            );
            return Ok(Got::one(pfn, dirty));
        }
        // A pass whose mark the zone is below can only pop a cached frame (above): the lend
        // and the direct take would refuse it at once, so it picks and gives back no slot
        // (with memory nearly full, every walk's pass at the low mark ends here).
        if zone.short_of(mark) {
            return Err(NoBlock::Empty);
        }
        let pfn = match self.caching() {
            // Emergency reserves go to the caller, not into a cache.
            Some(config) if mark.level != Level::Reserve => {
                // The slot to use: the one for this key, else a free one, else the one used
                // longest ago.
                let i = held
                    .or_else(|| c.slots.iter().position(|s| s.key.is_none()))
                    .unwrap_or_else(|| (0..SLOTS).min_by_key(|&i| c.slots[i].used).unwrap_or(0));
                give_back(&mut c.slots[i], &pc.states[i], nodes);
                let slot = &mut c.slots[i];
                let states = &pc.states[i];
                let lend_min = LEND_MIN.min(config.high.min(u32::from(u16::MAX)) as u16);
                let direct = zone.lend(
                    class,
                    mark,
                    (config.batch, lend_min),
                    (cpu.0, i as u8),
                    zero,
                    |lent| take_in(slot, states, lent, key),
                )?;
                match direct {
                    Some(got) => got,
                    None => {
                        c.clock += 1;
                        c.slots[i].used = c.clock;
                        let (pfn, dirty) =
                            pop_slot(&mut c.slots[i], &pc.states[i]).ok_or(NoBlock::Empty)?;
                        Got::one(pfn, dirty)
                    }
                }
            }
            _ => zone.alloc(Order::ZERO, mark, class, zero, None)?,
        };
        count(
            c.events,
            pc.node,
            asker.preferred,
            node.id(),
            asker.interleave,
        );
        Ok(pfn)
    }

    /// Frees an order-0 frame from `cpu`, dirty or clean: into its own pageblock with one
    /// swap, or to its zone (under the zone lock) when another CPU holds it or nobody does.
    /// `locate` finds the span of a frame outside the CPU's last one (it takes no lock).
    /// When a handle holds `cpu`'s cache, this is a free from elsewhere: to the zone. A frame
    /// freed dirty is filled through `poison` (the `poison` debug mode).
    pub(crate) fn free(
        &self,
        cpu: CpuId,
        pfn: Pfn,
        nodes: Nodes<'_>,
        locate: impl FnOnce(Pfn) -> Option<LastSpan>,
        dirty: bool,
        poison: Poison<'_>,
    ) -> Result<(), FreeError> {
        let pc = self
            .cpus
            .get(cpu.index())
            .ok_or(FreeError::UnknownCpu { cpu: cpu.0 })?;
        let zone = match lock_unclaimed(pc) {
            // The zone's free runs after the cache lock is given up.
            Some(mut c) => match c.find(pfn) {
                None => zone_of(&mut c, pfn, nodes, locate)?,
                Some((i, off)) => {
                    free_own(
                        &mut c.slots[i],
                        &pc.states[i],
                        off,
                        pfn,
                        dirty,
                        false,
                        poison,
                    )?;
                    let high = self.caching().map_or(0, |t| t.high as usize);
                    if c.slots[i].len > high {
                        give_back(&mut c.slots[i], &pc.states[i], nodes);
                    }
                    return Ok(());
                }
            },
            None => {
                let last = locate(pfn).ok_or(FreeError::Foreign { pfn })?;
                nodes
                    .get(last.node.index())
                    .ok_or(FreeError::Foreign { pfn })?
                    .zone(last.zone)
            }
        };
        zone.free(pfn, Order::ZERO, self, dirty, poison)
    }

    /// Gives back to their zones the pageblocks `cpu` holds for the (node, zone) pairs `wanted`
    /// accepts, and returns how many free frames they had. When a handle holds the cache, it
    /// posts a request instead, which the handle honours (giving back every pageblock) before
    /// its next operation or when it drops, and returns 0.
    pub(crate) fn drain_cpu(
        &self,
        cpu: CpuId,
        nodes: Nodes<'_>,
        wanted: impl Fn(NodeId, ZoneKind) -> bool,
    ) -> u64 {
        self.drain_cpu_kicking(cpu, nodes, wanted, true)
    }

    /// [`Caches::drain_cpu`], waking a claimed `cpu` through the platform's [`CpuKick`] only
    /// with `kick`.
    fn drain_cpu_kicking(
        &self,
        cpu: CpuId,
        nodes: Nodes<'_>,
        wanted: impl Fn(NodeId, ZoneKind) -> bool,
        kick: bool,
    ) -> u64 {
        let Some(pc) = self.cpus.get(cpu.index()) else {
            return 0;
        };
        loop {
            if let Some(mut c) = lock_unclaimed(pc) {
                return drain_slots(pc, &mut c, nodes, &wanted);
            }
            if self.post(cpu, pc, claim::REQUEST, kick) {
                return 0;
            }
        }
    }

    /// Gives back to their zones the pageblocks `cpu` holds with frames in `range`, memory
    /// going offline. When a handle holds the cache, it posts a request instead, as
    /// [`Caches::drain_cpu`] does: those pageblocks stay lent until the handle honours it.
    pub(crate) fn drain_range(&self, cpu: CpuId, nodes: Nodes<'_>, range: PhysRange) {
        let Some(pc) = self.cpus.get(cpu.index()) else {
            return;
        };
        loop {
            if let Some(mut c) = lock_unclaimed(pc) {
                for i in 0..SLOTS {
                    let s = &c.slots[i];
                    let at = |off: usize| Pfn::new(s.base.get() + off as u64);
                    if s.key.is_some()
                        && PhysRange::new(at(s.lo), at(s.hi)).is_some_and(|r| r.overlaps(&range))
                    {
                        give_back(&mut c.slots[i], &pc.states[i], nodes);
                    }
                }
                return;
            }
            if self.post(cpu, pc, claim::REQUEST, true) {
                return;
            }
        }
    }

    /// Makes `cpu` forget the span it freed into last if it lies in `range`, memory that went
    /// offline (the range may come back in another zone). When a handle holds the cache, it
    /// posts a note the handle honours before its next operation or when it drops.
    pub(crate) fn forget_range(&self, cpu: CpuId, range: PhysRange) {
        let Some(pc) = self.cpus.get(cpu.index()) else {
            return;
        };
        loop {
            if let Some(mut c) = lock_unclaimed(pc) {
                if c.last.is_some_and(|l| l.range.overlaps(&range)) {
                    c.last = None;
                }
                return;
            }
            // The layout published before the note is seen by the handle once it finds the
            // note (`post`), so its next lookup cannot find the old span. A note frees no
            // memory: it wakes nobody.
            if self.post(cpu, pc, claim::FORGET, false) {
                return;
            }
        }
    }

    /// Runs `retry` under pressure after every CPU gave back the pageblocks of the (node, zone)
    /// pairs `wanted` accepts (a claimed CPU gets a request; see the module doc). The retry
    /// runs even if this drain found nothing: another CPU may have given its frames back
    /// meanwhile (its own free under raised pressure, or another failing walk's drain).
    /// `asker` is the CPU whose handle runs the walk, if one does: it honours its own request
    /// in its retry, so the platform's [`CpuKick`] is not asked to wake it.
    pub(crate) fn under_pressure<R>(
        &self,
        nodes: Nodes<'_>,
        wanted: impl Fn(NodeId, ZoneKind) -> bool,
        asker: Option<CpuId>,
        retry: impl FnOnce() -> R,
    ) -> R {
        // Relaxed: the drain below takes every cache lock (or posts a Release request) after
        // this, which orders the raised pressure before any later take on that cache (see
        // `caching`).
        self.pressure.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.cpus.len() {
            let cpu = CpuId(i as u32);
            self.drain_cpu_kicking(cpu, nodes, &wanted, asker != Some(cpu));
        }
        let r = retry();
        self.pressure.fetch_sub(1, Ordering::Relaxed);
        r
    }

    /// Free frames held in all unclaimed caches (allocated as far as their zones know).
    pub(crate) fn cached_pages(&self) -> u64 {
        self.cpus
            .iter()
            .filter_map(|pc| {
                let c = lock_unclaimed(pc)?;
                Some(held_frames(pc, &c))
            })
            .sum()
    }

    /// Adds the numastat events that every CPU's cache counted for `node`: a claimed CPU's
    /// from before its claim (its handle adds those it counts meanwhile when it drops).
    pub(crate) fn events(&self, node: NodeId, into: &mut NumaStat) {
        for pc in self.cpus {
            if let Some(e) = pc.events.get(node.index() / 8) {
                // Relaxed: see `bump`.
                into.add_counts(
                    &e.0[node.index() % 8]
                        .each_ref()
                        .map(|c| c.load(Ordering::Relaxed)),
                );
            }
        }
    }

    /// Walks every unclaimed CPU's slots: each stack lists distinct frames that are free in
    /// its state array, inside the pageblock, and an empty slot holds no frame.
    pub(crate) fn check(&self) -> Result<(), InvariantError> {
        for pc in self.cpus {
            let Some(c) = lock_unclaimed(pc) else {
                continue;
            };
            for (i, slot) in c.slots.iter().enumerate() {
                if slot.key.is_none() {
                    // An empty slot must hold no frame: frees find their slot by range alone.
                    if slot.lo != slot.hi {
                        return Err(InvariantError::Pageblock { pfn: slot.base });
                    }
                    continue;
                }
                let states = &pc.states[i];
                let mut seen = Plane::EMPTY;
                for &off in &slot.stack[..slot.len] {
                    let off = usize::from(off);
                    // Relaxed: the owner's lock is held; a concurrent remote free only turns a
                    // handed-out frame free, never a free one.
                    let s = states.states[off].load(Ordering::Relaxed);
                    if off >= FRAMES || seen.get(off) || !state::is_free(s) {
                        return Err(InvariantError::Pageblock { pfn: slot.base });
                    }
                    seen.put(off, true);
                }
            }
        }
        Ok(())
    }
}

/// A CPU's cache held by a handle: it holds the cache lock from its claim until it drops, so
/// its operations take no lock. Remote drains post a request in `flags` that it honours
/// before each operation (a plain load when there is none) and when it drops.
///
/// Its hot paths (`pop_hot`, `pop_run`, `free` of its own frames) touch only the slot they
/// use, its state byte and the cache's counters, and only read the handle itself: the hot
/// slot's state array is resolved in [`Hot`], the tuning's `high` is kept here (a new tuning
/// comes with a request), and the local hits they count go to the cache's events when the
/// handle drops. A handle written on every operation would share its cache line with a
/// neighbour's in an array of handles, and two CPUs would fight over it.
#[derive(Debug)]
pub(crate) struct Owned<'m, 'a> {
    caches: &'m Caches<'a>,
    pc: &'m PerCpu<'a>,
    nodes: Nodes<'m>,
    cpu: CpuId,
    c: MutexGuard<'m, CpuCache<'a>>,
    /// The request the caller is about to make, as [`Owned::pop_hot`] names it (`None`: one
    /// that does not use the hot slot).
    asking: Option<u32>,
    /// Where the last request named `asking` popped a frame of the CPU's own node.
    hot: Option<Hot<'m>>,
    /// [`PcpConfig::high`] as of the claim or the last request honoured: `set_tuning` posts a
    /// request after it stores a new tuning, and honouring it reads the tuning again.
    high: usize,
    /// The cache's `HOLDS` bit as this handle last set it (see [`Owned::publish_holds`]).
    holds: bool,
}

/// A slot that served a request of the CPU's own node from the walk's fast path: the same
/// request tries it first next time, with no walk, while the slot still caches that key.
///
/// Invariant: `slot` caches `key`, and `states` is its state array. Every path of [`Owned`]
/// that can give a slot back (honouring a request, a refill, a free above `high`) drops or
/// checks the hot slot afterwards.
#[derive(Clone, Copy, Debug)]
struct Hot<'m> {
    slot: usize,
    key: Key,
    asking: u32,
    states: &'m SlotStates,
}

impl<'m> Owned<'m, '_> {
    /// The claimed CPU.
    pub(crate) fn cpu(&self) -> CpuId {
        self.cpu
    }

    /// The claimed CPU's node.
    pub(crate) fn node(&self) -> NodeId {
        self.pc.node
    }

    /// Free frames of the pageblocks the claimed cache holds, remote frees into them included.
    pub(crate) fn cached_pages(&self) -> u64 {
        held_frames(self.pc, &self.c)
    }

    /// Gives back every pageblock if a remote drain asked for it; `true` if one did.
    #[inline]
    pub(crate) fn honour(&mut self) -> bool {
        self.pending() && self.honour_now()
    }

    /// `true` if a drain request or a note waits to be honoured.
    #[inline]
    fn pending(&self) -> bool {
        // Acquire: pairs with the Release of the request, so the tuning and pressure stored
        // before it are seen by this operation.
        self.pc.flags.load(Ordering::Acquire) & (claim::REQUEST | claim::FORGET) != 0
    }

    /// Pops a frame for the request the caller names `asking` (its flags, say) from the slot
    /// that served it last from the CPU's own node, counting a local hit; `None` (and the
    /// caller walks, having named `asking` for the next time) if that slot has none or caches
    /// something else now.
    ///
    /// The walk's fast path would pop from the same slot: its zone is still the first of the
    /// node with memory for the request (zones gain memory by hot-add, and lose it only to
    /// offlining, which first takes its pageblocks back from this slot; a zone earlier in the
    /// list that gains some is used once this slot runs dry).
    ///
    /// Whether the frame may be dirty is exact only in the `poison` debug mode; other builds
    /// say it may be (see `hand_out_hot`), which is always safe to believe.
    #[inline]
    pub(crate) fn pop_hot(&mut self, asking: u32) -> Option<(Pfn, bool)> {
        self.honour();
        let got = self.hot_frames(asking, |slot, states| {
            pop_slot_with(slot, states, hand_out_hot).map(|got| (got, 1))
        });
        if got.is_none() {
            // Only the walk reads it: named on the way there, not on every hit.
            self.asking = Some(asking);
        }
        got
    }

    /// [`Owned::pop_hot`] when it needs no call: no request to honour and a frame on the hot
    /// slot's stack. `None` changes nothing, and the caller then takes its out-of-line path,
    /// which starts with `pop_hot`. A hot path built on this calls nothing, so the compiler
    /// need not save registers for it.
    #[inline]
    pub(crate) fn pop_hot_now(&mut self, asking: u32) -> Option<(Pfn, bool)> {
        if self.pending() {
            return None;
        }
        self.hot_frames(asking, |slot, states| {
            if slot.len == 0 {
                return None;
            }
            pop_slot_with(slot, states, hand_out_hot).map(|got| (got, 1))
        })
    }

    /// [`Owned::pop_hot`] for up to `out.len()` frames at once: pops a run of the hot slot's
    /// stack into `out`, each frame through `each` (given the frame and whether it may be
    /// dirty, as `pop_hot` says it), and returns how many it placed; 0 when the caller must
    /// walk.
    #[inline]
    pub(crate) fn pop_run(
        &mut self,
        asking: u32,
        out: &mut [Pfn],
        mut each: impl FnMut(Pfn, bool) -> Pfn,
    ) -> usize {
        self.honour();
        let placed = self.hot_frames(asking, |slot, states| {
            if slot.len == 0 && !rescan(slot, states) {
                return None;
            }
            let n = slot.len.min(out.len());
            let base = slot.base.get();
            let run = slot.stack.get(slot.len - n..slot.len)?;
            // From the top of the stack down, as single pops would take them.
            let mut placed = 0;
            for (dst, &off) in out.iter_mut().zip(run.iter().rev()) {
                let Some(byte) = states.states.get(usize::from(off)) else {
                    break;
                };
                *dst = each(Pfn::new(base + u64::from(off)), hand_out_hot(byte));
                placed += 1;
            }
            slot.len -= placed;
            Some((placed, placed as u64))
        });
        placed.unwrap_or_else(|| {
            // As in `pop_hot`.
            self.asking = Some(asking);
            0
        })
    }

    /// Runs `take` on the hot slot if it serves `asking`, then marks the slot used and counts
    /// the local hits `take` reports.
    #[inline]
    fn hot_frames<R>(
        &mut self,
        asking: u32,
        take: impl FnOnce(&mut Slot, &SlotStates) -> Option<(R, u64)>,
    ) -> Option<R> {
        let hot = self.hot.as_ref().filter(|h| h.asking == asking)?;
        let c = &mut *self.c;
        let slot = c.slots.get_mut(hot.slot)?;
        let (got, hits) = take(slot, hot.states)?;
        c.clock += 1;
        slot.used = c.clock;
        c.hits += hits;
        Some(got)
    }

    /// Says the caller's next request does not use the hot slot (see [`Owned::pop_hot`]).
    pub(crate) fn ask_other(&mut self) {
        self.asking = None;
    }

    /// [`Owned::honour`] once a note or request is posted; `true` if it was a drain request.
    #[cold]
    fn honour_now(&mut self) -> bool {
        // Acquire: as in `honour`. Cleared before the drain: a request posted during it is
        // honoured next time.
        let was = self
            .pc
            .flags
            .fetch_and(!(claim::REQUEST | claim::FORGET), Ordering::Acquire);
        self.honour_bits(was)
    }

    /// Honours the request and note in `was`, the flags a swap that cleared them returned;
    /// `true` if a drain request was among them.
    fn honour_bits(&mut self, was: u8) -> bool {
        if was & claim::FORGET != 0 {
            self.c.last = None;
        }
        let drain = was & claim::REQUEST != 0;
        if drain {
            drain_slots(self.pc, &mut self.c, self.nodes, |_, _| true);
            self.hot = None;
            self.high = self.caches.tuning().high as usize;
            self.publish_holds();
        }
        drain
    }

    /// Makes the cache's `HOLDS` bit say whether it holds a pageblock now, after the claim and
    /// after every change of its slots: a drain then wakes the CPU only if it has something to
    /// give back.
    ///
    /// A bit left set where none is held costs a needless kick. A bit still clear after a
    /// refill would leave a request posted meanwhile unkicked, with the new pageblock held: so
    /// the only refill, [`CacheAccess::take`], publishes before it returns, and the walk it
    /// serves honours a request afterwards (`CpuHandle::alloc_walk`). The set is in the same
    /// atomic as the request: either the drain sees it and kicks, or the owner finds the
    /// request in its next load.
    fn publish_holds(&mut self) {
        let holds = self.c.slots.iter().any(|s| s.key.is_some());
        if holds != self.holds {
            // Relaxed: only the bit's place in the flags' order matters (see above).
            if holds {
                self.pc.flags.fetch_or(claim::HOLDS, Ordering::Relaxed);
            } else {
                self.pc.flags.fetch_and(!claim::HOLDS, Ordering::Relaxed);
            }
            self.holds = holds;
        }
    }

    /// Gives slot `i`'s pageblock back to its zone (its frees left more than `high` free).
    #[cold]
    fn give_back_slot(&mut self, i: usize) {
        if let (Some(slot), Some(states)) = (self.c.slots.get_mut(i), self.pc.states.get(i)) {
            give_back(slot, states, self.nodes);
        }
        if self.hot.as_ref().is_some_and(|h| h.slot == i) {
            self.hot = None;
        }
        self.publish_holds();
    }

    /// [`Owned::free`] of a frame of the hot slot when it needs no call: nothing to honour,
    /// the frame handed out, and the slot at most `high` frames free after it. `false` changes
    /// nothing, and the caller then takes [`Owned::free`]. Without the `poison` debug mode
    /// only: its fill is a call.
    #[inline]
    pub(crate) fn free_now(&mut self, pfn: Pfn, dirty: bool, unchecked: bool) -> bool {
        if cfg!(feature = "poison") || self.pending() {
            return false;
        }
        let Some(h) = &self.hot else {
            return false;
        };
        let Some(slot) = self.c.slots.get_mut(h.slot) else {
            return false;
        };
        let Some((off, byte)) = slot
            .holds(pfn)
            .and_then(|off| Some((off, h.states.states.get(off)?)))
        else {
            return false;
        };
        if slot.len >= self.high {
            return false;
        }
        // A refusal changed nothing, and `free_own` decides the frame's fate again.
        if mark_freed(byte, dirty, unchecked).is_err() {
            return false;
        }
        slot.push(off);
        true
    }

    /// Frees an order-0 frame through the cache: see [`Caches::free`]. `unchecked` replaces
    /// the double-free check of a frame of the CPU's own pageblocks by a store (the caller
    /// guarantees the frame is handed out and freed once). A frame freed dirty is filled
    /// through `poison` (the `poison` debug mode).
    #[inline]
    pub(crate) fn free(
        &mut self,
        pfn: Pfn,
        locate: impl FnOnce(Pfn) -> Option<LastSpan>,
        dirty: bool,
        unchecked: bool,
        poison: Poison<'_>,
    ) -> Result<(), FreeError> {
        self.honour();
        let Some((i, off, states)) = self.own_slot(pfn) else {
            return self.free_elsewhere(pfn, locate, dirty, poison);
        };
        let Some(slot) = self.c.slots.get_mut(i) else {
            return Err(FreeError::Foreign { pfn });
        };
        free_own(slot, states, off, pfn, dirty, unchecked, poison)?;
        if slot.len > self.high {
            self.give_back_slot(i);
        }
        Ok(())
    }

    /// The slot of this CPU's pageblocks that holds `pfn`, the frame's offset there and the
    /// slot's state array: the hot slot first (frees mostly hit the pageblock allocations
    /// come from), then the others.
    #[inline]
    fn own_slot(&self, pfn: Pfn) -> Option<(usize, usize, &'m SlotStates)> {
        if let Some(h) = &self.hot
            && let Some(off) = self.c.slots.get(h.slot).and_then(|s| s.holds(pfn))
        {
            return Some((h.slot, off, h.states));
        }
        let (i, off) = self.c.find(pfn)?;
        Some((i, off, self.pc.states.get(i)?))
    }

    /// A free of a frame outside this CPU's pageblocks: to its zone, under the zone lock.
    #[inline(never)]
    fn free_elsewhere(
        &mut self,
        pfn: Pfn,
        locate: impl FnOnce(Pfn) -> Option<LastSpan>,
        dirty: bool,
        poison: Poison<'_>,
    ) -> Result<(), FreeError> {
        zone_of(&mut self.c, pfn, self.nodes, locate)?.free(
            pfn,
            Order::ZERO,
            self.caches,
            dirty,
            poison,
        )
    }

    /// Frees order-0 frames of this CPU's own pageblocks, dirty, all or none. `Ok(false)`, with
    /// nothing changed, if one of them is not a frame of its pageblocks: the caller then frees
    /// them all another way.
    ///
    /// It holds the locks of the zones the frames' pageblocks belong to (usually one) while it
    /// checks and frees the frames: every other writer of a lent frame's byte holds that lock,
    /// so the bytes change with plain stores, and a refused bulk puts the ones it changed back
    /// before anyone else can see them. A free of one of the frames racing this call waits for
    /// the lock and then finds the frame free, or still handed out if the bulk was refused.
    ///
    /// # Errors
    /// A [`BulkFreeError`] naming the first frame that is not handed out (a duplicate within
    /// `pfns` included); the state is then unchanged.
    pub(crate) fn free_bulk(
        &mut self,
        pfns: &[Pfn],
        poison: Poison<'_>,
    ) -> Result<bool, BulkFreeError> {
        self.honour();
        let mut used = 0u8;
        for &pfn in pfns {
            let Some((i, _, _)) = self.own_slot(pfn) else {
                return Ok(false);
            };
            used |= 1 << i;
        }
        let family = ZoneFamily(self.nodes);
        let mut zones = ZoneSet::new(&family);
        let mut wanted: [Option<usize>; SLOTS] = core::array::from_fn(|i| {
            let k = self.c.slots[i].key.filter(|_| used & 1 << i != 0)?;
            Some(zone_index(k.node, k.zone))
        });
        wanted.sort_unstable();
        let mut last = None;
        for &z in wanted.iter().flatten() {
            // Distinct slots may share a zone: it is taken once. A zone that cannot be locked
            // (none can fail: the slots cache zones of this machine) sends the bulk the other
            // way, before anything changed.
            if last != Some(z) && !zones.lock(z) {
                return Ok(false);
            }
            last = Some(z);
        }
        let lens: [usize; SLOTS] = core::array::from_fn(|i| self.c.slots[i].len);
        for (k, &pfn) in pfns.iter().enumerate() {
            let (i, byte) = match self.own_slot(pfn) {
                Some((i, off, states)) => (i, states.states.get(off).map(|b| (off, b))),
                None => (0, None),
            };
            // Relaxed: the zone locks held order every other writer of these bytes.
            let error = match byte.map(|(off, b)| (off, b, b.load(Ordering::Relaxed))) {
                Some((off, b, state::HELD)) => {
                    // Release: as a free's swap (the zone lock publishes it too).
                    b.store(state::FREE_DIRTY, Ordering::Release);
                    self.c.slots[i].push(off);
                    continue;
                }
                Some((_, _, found)) => match misuse(found, pfn, 0) {
                    FreeError::DoubleFree { .. } if pfns[..k].contains(&pfn) => {
                        FreeError::Duplicate { pfn }
                    }
                    e => e,
                },
                None => FreeError::Foreign { pfn },
            };
            self.undo_bulk(&pfns[..k], lens);
            return Err(BulkFreeError { index: k, error });
        }
        drop(zones);
        // Every frame is free now, and only this CPU, busy here, can hand one out again: the
        // `poison` debug mode fills them after the last check, so a refused bulk touches none.
        if poison.on() {
            for &pfn in pfns {
                poison.fill(pfn, 1);
            }
        }
        for i in 0..SLOTS {
            if self.c.slots[i].len > self.high {
                self.give_back_slot(i);
            }
        }
        Ok(true)
    }

    /// Puts the frames a refused [`Owned::free_bulk`] freed back to handed out, and its stacks
    /// back to their lengths `lens`; runs under the zone locks the bulk holds.
    #[cold]
    fn undo_bulk(&mut self, done: &[Pfn], lens: [usize; SLOTS]) {
        for &pfn in done {
            if let Some((i, off)) = self.c.find(pfn)
                && let Some(byte) = self.pc.states.get(i).and_then(|s| s.states.get(off))
            {
                // Relaxed: under the zone locks, nothing else saw the frame free.
                byte.store(state::HELD, Ordering::Relaxed);
            }
        }
        for (slot, len) in self.c.slots.iter_mut().zip(lens) {
            slot.len = len;
        }
    }
}

impl CacheAccess for Owned<'_, '_> {
    fn pop(
        &mut self,
        node: NodeId,
        zone: &Zone,
        class: Class,
        asker: Asker,
    ) -> Option<(Pfn, bool)> {
        self.honour();
        let key = Key {
            node,
            zone: zone.kind(),
            class,
        };
        let got = pop_key(self.pc, &mut self.c, key, asker)?;
        if let Some(asking) = self.asking
            && node == self.pc.node
            && asker.preferred == node
            && !asker.interleave
        {
            let states = self.pc.states;
            self.hot = self
                .c
                .slots
                .iter()
                .position(|s| s.key == Some(key))
                .and_then(|slot| {
                    Some(Hot {
                        slot,
                        key,
                        asking,
                        states: states.get(slot)?,
                    })
                });
        }
        Some(got)
    }

    fn take(&mut self, want: &Want<'_>, nodes: Nodes<'_>, zero: bool) -> Result<Got, NoBlock> {
        self.honour();
        let (caches, pc, cpu) = (self.caches, self.pc, self.cpu);
        let got = caches.take_at(cpu, pc, &mut self.c, want, nodes, zero);
        self.publish_holds();
        // The refill may have given the hot slot back (to lend that slot another pageblock).
        if let Some(h) = &self.hot
            && self
                .c
                .slots
                .get(h.slot)
                .is_none_or(|s| s.key != Some(h.key))
        {
            self.hot = None;
        }
        got
    }
}

impl Drop for Owned<'_, '_> {
    fn drop(&mut self) {
        let c = &mut *self.c;
        count_local(c.events, self.pc.node, core::mem::take(&mut c.hits));
        // Acquire: as in `honour`; Release: a drain that finds the claim gone takes the lock,
        // which this guard gives up right after. The request and note waiting go in the same
        // swap as the claim: once the claim is gone, a new one may clear them (as stale) before
        // a second swap here could read them.
        let was = self.pc.flags.fetch_and(
            !(claim::CLAIMED | claim::REQUEST | claim::FORGET | claim::HOLDS),
            Ordering::AcqRel,
        );
        // The bit went with the claim: the drain below must not clear a new claim's.
        self.holds = false;
        self.honour_bits(was);
    }
}

/// The byte of a frame freed dirty or clean.
fn freed(dirty: bool) -> u8 {
    if dirty {
        state::FREE_DIRTY
    } else {
        state::FREE_CLEAN
    }
}

/// Free frames of the pageblocks a CPU's cache holds.
fn held_frames(pc: &PerCpu<'_>, c: &CpuCache<'_>) -> u64 {
    (0..SLOTS)
        .filter(|&i| c.slots[i].key.is_some())
        .map(|i| free_frames(&pc.states[i]))
        .sum()
}

/// Free frames of a state array.
fn free_frames(states: &SlotStates) -> u64 {
    states
        .states
        .iter()
        // Relaxed: a count for diagnostics and drains, exact under the owner's lock.
        .filter(|s| state::is_free(s.load(Ordering::Relaxed)))
        .count() as u64
}

/// The error a free of a block of `order` at `pfn` meets when its byte is `found`.
fn misuse(found: u8, pfn: Pfn, order: u8) -> FreeError {
    if state::is_free(found) {
        FreeError::DoubleFree { pfn }
    } else if found == state::INTERIOR {
        FreeError::NotAllocated { pfn }
    } else if found == state::OUTSIDE {
        FreeError::Foreign { pfn }
    } else if found == state::CLAIMED {
        FreeError::DoubleFree { pfn }
    } else {
        FreeError::WrongOrder {
            pfn,
            given: Order::new(order),
            allocated: Order::new(found & state::ORDER),
        }
    }
}

impl Caches<'_> {
    fn states_of(&self, cpu: u32, slot: u8) -> Option<&SlotStates> {
        self.cpus
            .get(cpu as usize)
            .and_then(|pc| pc.states.get(usize::from(slot)))
    }
}

impl HotFrames for Caches<'_> {
    fn claim(&self, cpu: u32, slot: u8, off: usize, pfn: Pfn) -> Result<(), FreeError> {
        let s = self
            .states_of(cpu, slot)
            .and_then(|st| st.states.get(off))
            .ok_or(FreeError::NotAllocated { pfn })?;
        // AcqRel: as in `free`; a claimed frame is one no other free can take.
        s.compare_exchange(
            state::HELD,
            state::CLAIMED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .map(|_| ())
        .map_err(|found| {
            if found == state::CLAIMED {
                FreeError::Duplicate { pfn }
            } else {
                misuse(found, pfn, 0)
            }
        })
    }

    fn commit(&self, cpu: u32, slot: u8, off: usize) {
        if let Some(st) = self.states_of(cpu, slot)
            && let Some(s) = st.states.get(off)
        {
            // Release: as in `free`; only a claim's holder changes a claimed byte.
            s.store(state::FREE_DIRTY, Ordering::Release);
            st.remote.fetch_add(1, Ordering::Release);
        }
    }

    fn unclaim(&self, cpu: u32, slot: u8, off: usize) {
        if let Some(s) = self.states_of(cpu, slot).and_then(|st| st.states.get(off)) {
            // Relaxed: the frame goes back to its holder as it was; nothing was published.
            s.store(state::HELD, Ordering::Relaxed);
        }
    }

    fn free(
        &self,
        cpu: u32,
        slot: u8,
        off: usize,
        order: u8,
        pfn: Pfn,
        dirty: bool,
        poison: Poison<'_>,
    ) -> Result<(), FreeError> {
        let states = self
            .states_of(cpu, slot)
            .ok_or(FreeError::NotAllocated { pfn })?;
        let s = states.states.get(off).ok_or(FreeError::Foreign { pfn })?;
        // The `poison` debug mode fills the block between a swap that claims it and the store
        // that makes it free: the owner's own free of the frame (no zone lock) waits for a
        // claimed byte, so a double free is refused untouched whichever free wins.
        let fill = dirty && poison.on();
        // AcqRel: as in `Caches::free`; the owner's store of a popped frame and this swap are
        // the only writers of a handed-out frame's byte.
        s.compare_exchange(
            state::HELD | order,
            if fill { state::CLAIMED } else { freed(dirty) },
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .map_err(|found| misuse(found, pfn, order))?;
        if fill {
            poison.fill(pfn, 1 << order);
            // Release: as the swap; only this claim's holder changes a claimed byte.
            s.store(freed(dirty), Ordering::Release);
        }
        for k in 1..1usize << order {
            // Release: the block's frames are free for the owner once it sees the count below.
            states.states[off + k].store(freed(dirty), Ordering::Release);
        }
        // Release: the owner's swap of the count (then an Acquire load per byte) finds them.
        states.remote.fetch_add(1 << order, Ordering::Release);
        Ok(())
    }
}
