//! What the two bare-metal kernels share: the console lock, the failure path, the global heap,
//! and everything the kernel does once numaframe has booted.
//!
//! The platform module (`crate::arch`: `aarch64` or `x86`) provides:
//! - `write_console(&str)`: raw console output (no lock);
//! - `halt(ok) -> !`: stop the machine so that QEMU exits and tells the two apart as well as
//!   the platform can;
//! - `cpu_index()`: the machine CPU index of the running CPU (0 until it is known);
//! - `start_cpus(machine, boot) -> Vec<usize>`: prepares the other CPUs (stacks, records) and
//!   returns the machine CPU indices of every CPU that will run the SMP workload, the boot CPU
//!   first; `release_cpus(smp)` then starts them, and each calls [`secondary`] with its slot.
//!
//! Physical memory is identity-mapped on both (the MMU off on aarch64, an identity page table
//! on x86), so the heap reaches frames through [`IdentityMap`].

use alloc::boxed::Box;
use core::fmt::{self, Write};
use core::panic::PanicInfo;

use numaframe::heap::{DEFAULT_GROW_ORDER, IdentityMap, NumaHeap};
use numaframe::{AllocFlags, Machine, NodeId, Order, PAGE_SIZE, Pfn};

use crate::arch;
use crate::boot::{self, MAX_CPUS, MAX_NODES, Options};
use crate::smp::Smp;

/// Serialises console lines from several CPUs.
static CONSOLE: spin::Mutex<()> = spin::Mutex::new(());

/// The raw console.
struct Raw;

impl Write for Raw {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        arch::write_console(s);
        Ok(())
    }
}

/// Prints one line, whole, even when other CPUs print at the same time.
pub fn println(args: fmt::Arguments<'_>) {
    let _line = CONSOLE.lock();
    let _ = writeln!(Raw, "{args}");
}

/// A console for code that writes through `fmt::Write` (the boot steps): each write is whole.
pub struct Console;

impl Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let _line = CONSOLE.lock();
        arch::write_console(s);
        Ok(())
    }
}

/// Prints a `numaframe-unikernel: FAILED: …` line and stops the machine.
pub fn fail_with(args: fmt::Arguments<'_>) -> ! {
    println(format_args!("numaframe-unikernel: FAILED: {args}"));
    arch::halt(false)
}

macro_rules! fail {
    ($($arg:tt)*) => {
        $crate::kernel::fail_with(format_args!($($arg)*))
    };
}
pub(crate) use fail;

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    // A CPU that panics while printing holds the console lock: give the others' line a moment,
    // then print regardless rather than hide the panic.
    let mut line = None;
    for _ in 0..1_000_000 {
        line = CONSOLE.try_lock();
        if line.is_some() {
            break;
        }
        core::hint::spin_loop();
    }
    let _ = writeln!(
        Raw,
        "numaframe-unikernel: FAILED: cpu{} panicked: {info}",
        arch::cpu_index()
    );
    drop(line);
    arch::halt(false)
}

// SAFETY: both platforms keep physical memory identity-mapped and writable for the program's
// life, and the frames the machine hands out are RAM it was given.
pub static FRAMES: IdentityMap = unsafe { IdentityMap::new() };

#[global_allocator]
static HEAP: NumaHeap<'static, 'static, MAX_NODES> = NumaHeap::new();

/// The node of each machine CPU, for the heap's `current_node`.
static CPU_NODES: spin::Once<[NodeId; MAX_CPUS]> = spin::Once::new();
/// The SMP run the other CPUs join.
static SMP: spin::Once<&'static Smp<'static, 'static>> = spin::Once::new();

/// The node of the running CPU.
fn current_node() -> NodeId {
    CPU_NODES
        .get()
        .and_then(|nodes| nodes.get(arch::cpu_index()))
        .copied()
        .unwrap_or_default()
}

fn heap_frames(node: NodeId) -> u64 {
    HEAP.stats(node).frames
}

/// Everything after `Machine::boot`: the fallback lines, the heap, huge pages, the policies,
/// the SMP run on every CPU `arch` starts, and the summary. `cpus` holds the node of each
/// machine CPU and `boot_cpu` the boot CPU's index. Does not return: the machine stops.
pub fn run(
    machine: &'static Machine<'static>,
    options: &Options,
    bootargs: &str,
    cpus: &[NodeId],
    boot_cpu: usize,
) -> ! {
    let out = &mut Console;
    let managed: u64 = machine.nodes().iter().map(|n| n.managed_pages()).sum();
    println(format_args!(
        "numaframe-unikernel: numaframe manages {} MiB on {} nodes{}",
        (managed * PAGE_SIZE) >> 20,
        machine.memory_nodes().count(),
        if options.linux_boot_order {
            " (Linux boot order)"
        } else {
            ""
        }
    ));
    // The contract: the kernel's fallback lines, one per node, ascending.
    if boot::print_zonelists(machine, out).is_err() {
        fail!("console")
    }

    let mut nodes = [NodeId::new(0); MAX_CPUS];
    nodes[..cpus.len()].copy_from_slice(cpus);
    CPU_NODES.call_once(|| nodes);
    let cpu_node = cpus.get(boot_cpu).copied().unwrap_or_default();
    // SAFETY: the kernel frees through the machine only blocks it allocated itself; the heap's
    // blocks go back through the heap alone.
    if let Err(e) = unsafe { HEAP.init(machine, &FRAMES, current_node, DEFAULT_GROW_ORDER) } {
        fail!("heap: {e}")
    }
    let huge = match boot::reserve_hugepages(machine, bootargs, out) {
        Ok(r) => r,
        Err(e) => fail!("{e}"),
    };
    #[cfg(all(target_arch = "aarch64", feature = "defmt"))]
    crate::log::hugepages(machine);
    let frames = match boot::exercise_policies(machine, cpu_node, options.weights(), out) {
        Ok(f) => f,
        Err(e) => fail!("{e}"),
    };
    scrub_nearby(machine, cpu_node);
    let heap_bytes = match boot::exercise_heap() {
        Ok(b) => b,
        Err(e) => fail!("{e}"),
    };
    for node in machine.topology().node_ids() {
        let s = HEAP.stats(node);
        if s.frames > 0 {
            println(format_args!(
                "heap: node {node}: {} chunks, {} frames, {} bytes in use",
                s.chunks, s.frames, s.used
            ));
        }
    }

    let participants = arch::start_cpus(machine, boot_cpu);
    let started = participants.len();
    let smp: &'static Smp<'static, 'static> = Box::leak(Box::new(Smp::new(
        machine,
        &FRAMES,
        heap_frames,
        &arch::KICKS,
        participants,
    )));
    SMP.call_once(|| smp);
    arch::release_cpus(smp);
    smp.run(0);
    let report = match smp.finish() {
        Ok(r) => r,
        Err(e) => fail!("{e}"),
    };
    println(format_args!(
        "numaframe-unikernel: smp: {started} of {} CPUs ran: {report}",
        cpus.len()
    ));

    println(format_args!(
        "numaframe-unikernel: ok: {} nodes, {} MiB managed, {} huge pages, {frames} frames under 6 policies, {} KiB through the heap, {started} CPUs; powering off",
        machine.topology().len(),
        (managed * PAGE_SIZE) >> 20,
        huge.allocated.iter().sum::<u64>(),
        heap_bytes >> 10,
    ));
    #[cfg(all(target_arch = "aarch64", feature = "defmt"))]
    crate::log::done();
    arch::halt(true)
}

/// Frames the boot CPU scrubs per node while it has nothing else to do (16 MiB).
const SCRUB_BUDGET: u64 = 4096;

/// The bytes of frame `pfn`, through the identity map.
fn frame_bytes(pfn: Pfn) -> &'static mut [u8] {
    let p: *mut u8 = core::ptr::with_exposed_provenance_mut(pfn.addr().get() as usize);
    // SAFETY: RAM is identity-mapped (see the arch's `Identity`), and the caller holds the
    // frame: the allocator handed it out and nobody else uses it until it is freed.
    unsafe { core::slice::from_raw_parts_mut(p, PAGE_SIZE as usize) }
}

/// Scrubs the nodes nearest `cpu_node` first, as an idle CPU would, then checks that a frame
/// dirtied and freed comes back zeroed with `ZERO`.
fn scrub_nearby(machine: &Machine<'_>, cpu_node: NodeId) {
    let dirty = || machine.nodes().iter().map(|n| n.dirty_pages()).sum::<u64>();
    let before = dirty();
    let mut near = [NodeId::new(0); MAX_NODES];
    let n = machine.fallback_order(cpu_node, &mut near);
    for &node in &near[..n] {
        machine.scrub(node, SCRUB_BUDGET);
    }
    let after = dirty();
    let Some(p) = machine.alloc(cpu_node, Order::ZERO, AllocFlags::empty()) else {
        fail!("scrub: no frame")
    };
    frame_bytes(p).fill(0xa5);
    if machine.free(p, Order::ZERO).is_err() {
        fail!("scrub: free")
    }
    let Some(q) = machine.alloc(cpu_node, Order::ZERO, AllocFlags::ZERO) else {
        fail!("scrub: no zeroed frame")
    };
    if frame_bytes(q).iter().any(|b| *b != 0) {
        fail!("scrub: a zeroed frame at {q} holds data")
    }
    if machine.free(q, Order::ZERO).is_err() {
        fail!("scrub: free")
    }
    println(format_args!(
        "scrub: cleared {} of {before} dirty free frames near node {cpu_node}; zeroed frames read zero",
        before - after.min(before)
    ));
}

/// The stack of each started CPU: 2^5 frames, 128 KiB.
const STACK_ORDER: Order = Order::new(5);

/// Gives every CPU but the boot CPU a stack from its own node (the nearest node with memory
/// for a memoryless one), handing `place` each one's SMP slot, machine CPU index and stack
/// top; returns the SMP participants, the boot CPU first.
pub fn give_stacks(
    machine: &Machine<'_>,
    boot_cpu: usize,
    mut place: impl FnMut(usize, usize, u64),
) -> alloc::vec::Vec<usize> {
    let mut participants = alloc::vec::Vec::with_capacity(machine.cpu_count());
    participants.push(boot_cpu);
    for index in (0..machine.cpu_count()).filter(|i| *i != boot_cpu) {
        let node = machine
            .cpu(index)
            .and_then(|c| machine.cpu_node(c))
            .unwrap_or_default();
        let Some(stack) = machine.alloc(node, STACK_ORDER, AllocFlags::empty()) else {
            fail!("no memory for the stack of cpu{index}")
        };
        place(
            participants.len(),
            index,
            stack.addr().get() + STACK_ORDER.frames() * PAGE_SIZE,
        );
        participants.push(index);
    }
    participants
}

/// Where a CPU other than the boot CPU goes once it has a stack: it joins the SMP run as
/// participant `slot`, then waits for the boot CPU to stop the machine.
pub fn secondary(slot: usize) -> ! {
    match SMP.get() {
        Some(smp) => smp.run(slot),
        None => fail!("cpu{} started before the SMP run", arch::cpu_index()),
    }
    arch::park()
}
