//! Starting the other CPUs: a stack and a start record for each, the real-mode trampoline in a
//! page below 1 MiB, and INIT-SIPI-SIPI through the boot CPU's local APIC, one CPU at a time.
//!
//! The CPUs are the MADT's enabled processors; each CPU's stack (128 KiB) comes from numaframe
//! on the CPU's node, before the SMP run takes its snapshot. For each CPU in turn the boot CPU
//! fills [`START`] (its own CR3, the stack top, the SMP slot, the machine CPU index), sends INIT,
//! waits 10 ms, sends STARTUP twice 200 µs apart (Intel's universal start-up algorithm, SDM
//! Vol. 3A 10.4.4), and waits for the CPU to report in before it starts the next one, so one
//! record serves every CPU. A CPU that does not report within [`REPORT_TIMEOUT_MS`] fails the
//! run. The delays are timed on the HPET.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use numaframe::{Machine, PAGE_SIZE};

use super::lapic::LocalApic;
use super::{acpi, cpu, entry};
use crate::boot::MAX_CPUS;
use crate::kernel::{self, fail, println};
use crate::smp::Smp;

/// What a starting CPU reads in long mode, before it has a stack: `entry` reads the fields at
/// offsets 0, 8, 16 and 24.
#[repr(C)]
pub struct StartRecord {
    /// The boot CPU's page-table root.
    cr3: AtomicU64,
    /// Top of the CPU's stack.
    stack_top: AtomicU64,
    /// The CPU's slot in the SMP run.
    slot: AtomicU64,
    /// The CPU's machine index.
    cpu: AtomicU64,
}

const _: () = assert!(
    core::mem::offset_of!(StartRecord, stack_top) == 8
        && core::mem::offset_of!(StartRecord, slot) == 16
        && core::mem::offset_of!(StartRecord, cpu) == 24
);

/// The record of the CPU being started.
pub static START: StartRecord = StartRecord {
    cr3: AtomicU64::new(0),
    stack_top: AtomicU64::new(0),
    slot: AtomicU64::new(0),
    cpu: AtomicU64::new(0),
};

/// The slot of the last CPU that reported in.
static REPORTED: AtomicUsize = AtomicUsize::new(0);
/// The stack top of each SMP slot (slot 0, the boot CPU, is unused).
static STACKS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// Milliseconds a started CPU has to report in.
const REPORT_TIMEOUT_MS: u64 = 2_000;
/// Where real-mode RAM ends and the legacy video memory (and STARTUP vectors 0xa0..0xbf, which
/// Intel reserves) begins.
const LOW_RAM_END: u64 = 0xa_0000;

unsafe extern "C" {
    /// The trampoline's first and one-past-last byte (see `entry`).
    static ap_trampoline: u8;
    static ap_trampoline_end: u8;
}

/// What starting CPUs needs from the boot CPU: its local APIC and the trampoline's page.
#[derive(Clone, Copy, Debug)]
pub struct Startup {
    /// The boot CPU's local APIC.
    pub lapic: LocalApic,
    /// The trampoline's page (physical address, below [`LOW_RAM_END`]).
    pub trampoline: u64,
}

/// The trampoline's page: the lowest page above page 0 (the real-mode interrupt table and the
/// BIOS data area) that lies whole in one of the `ram` ranges (bytes: base, length), ends below
/// [`LOW_RAM_END`], and overlaps none of `keep` (bytes: base, length; the PVH boot information).
/// Below 1 MiB, so numaframe never manages it (`kmain` keeps the first MiB out of it) and the
/// kernel's page tables map it.
pub fn trampoline_page(ram: &[(u64, u64)], keep: &[(u64, u64)]) -> Option<u64> {
    let overlaps = |page: u64, &(base, len): &(u64, u64)| {
        base < page + PAGE_SIZE && page < base.saturating_add(len)
    };
    (1..LOW_RAM_END / PAGE_SIZE)
        .map(|n| n * PAGE_SIZE)
        .find(|&page| {
            ram.iter()
                .any(|&(base, len)| base <= page && page + PAGE_SIZE <= base.saturating_add(len))
                && !keep.iter().any(|k| overlaps(page, k))
        })
}

/// Gives every CPU but the boot CPU a stack from its own node; returns the SMP participants,
/// the boot CPU first.
pub fn start_cpus(machine: &Machine<'_>, boot_cpu: usize) -> Vec<usize> {
    kernel::give_stacks(machine, boot_cpu, |slot, _, top| {
        // Relaxed: read by the boot CPU itself in `release_cpus`.
        STACKS[slot].store(top, Ordering::Relaxed);
    })
}

/// Milliseconds on the HPET since `since` (nanoseconds), or a failure without one.
fn elapsed_ms(since: u64) -> u64 {
    let Some(now) = acpi::hpet_nanos() else {
        fail!("smp: no HPET to time INIT-SIPI-SIPI")
    };
    now.saturating_sub(since) / 1_000_000
}

/// Waits `micros` microseconds on the HPET.
fn delay(micros: u64) {
    let Some(start) = acpi::hpet_nanos() else {
        fail!("smp: no HPET to time INIT-SIPI-SIPI")
    };
    while acpi::hpet_nanos().unwrap_or(u64::MAX).saturating_sub(start) < micros * 1_000 {
        core::hint::spin_loop();
    }
}

/// Waits (up to 10 ms) for the local APIC to have sent the last IPI.
fn wait_sent(lapic: &LocalApic, what: &str, index: usize, apic: u32) {
    let start = acpi::hpet_nanos().unwrap_or_default();
    while lapic.pending() {
        if elapsed_ms(start) >= 10 {
            fail!("smp: the local APIC did not send the {what} IPI to cpu{index} (APIC {apic:#x})")
        }
        core::hint::spin_loop();
    }
}

/// Starts the SMP run's other participants, one at a time: each with INIT-SIPI-SIPI through
/// the trampoline, then waits for it to report in. `apic_ids` holds the APIC id of each machine
/// CPU.
pub fn release_cpus(smp: &Smp<'_, '_>, startup: &Startup, apic_ids: &[u32]) {
    if smp.len() < 2 {
        return;
    }
    let code = (&raw const ap_trampoline).addr();
    let len = (&raw const ap_trampoline_end).addr() - code;
    let page = startup.trampoline;
    if len > PAGE_SIZE as usize {
        fail!("smp: the trampoline takes {len} bytes, more than a page")
    }
    let to = core::ptr::with_exposed_provenance_mut::<u8>(page as usize);
    // SAFETY: the trampoline is `len` bytes of this image; the page is RAM below 1 MiB that
    // nothing else uses (see `trampoline_page`), identity-mapped writable by the kernel's page
    // tables, and no CPU runs in it yet.
    unsafe { core::ptr::copy_nonoverlapping(core::ptr::with_exposed_provenance(code), to, len) };
    let vector = (page / PAGE_SIZE) as u8;
    let cr3 = cpu::cr3();
    for (slot, stack_top) in STACKS.iter().enumerate().take(smp.len()).skip(1) {
        let Some(index) = smp.cpu_of(slot) else {
            continue;
        };
        let Some(&apic) = apic_ids.get(index) else {
            fail!("smp: cpu{index} has no APIC id")
        };
        // Relaxed: the fence below orders these before the IPIs that start the CPU.
        START.cr3.store(cr3, Ordering::Relaxed);
        START
            .stack_top
            .store(stack_top.load(Ordering::Relaxed), Ordering::Relaxed);
        START.slot.store(slot as u64, Ordering::Relaxed);
        START.cpu.store(index as u64, Ordering::Relaxed);
        // SeqCst: the record and the trampoline reach memory before the ICR write that starts
        // the CPU, which then reads them (x86 keeps stores in order; this also keeps the
        // compiler from moving them past the APIC's volatile writes).
        fence(Ordering::SeqCst);
        let start = acpi::hpet_nanos().unwrap_or_default();
        if let Err(e) = startup.lapic.send_init(apic) {
            fail!("smp: cpu{index}: {e}")
        }
        wait_sent(&startup.lapic, "INIT", index, apic);
        delay(10_000);
        for _ in 0..2 {
            if let Err(e) = startup.lapic.send_startup(apic, vector) {
                fail!("smp: cpu{index}: {e}")
            }
            wait_sent(&startup.lapic, "STARTUP", index, apic);
            delay(200);
        }
        // Acquire: pairs with the started CPU's Release report.
        while REPORTED.load(Ordering::Acquire) != slot {
            if elapsed_ms(start) >= REPORT_TIMEOUT_MS {
                fail!(
                    "smp: cpu{index} (APIC {apic:#x}) did not report in within {REPORT_TIMEOUT_MS} ms of INIT-SIPI-SIPI through {page:#x}"
                )
            }
            core::hint::spin_loop();
        }
        println(format_args!(
            "numaframe-unikernel: cpu{index} (APIC {apic:#x}) started through the trampoline at {page:#x} in {} ms",
            elapsed_ms(start)
        ));
    }
}

/// Where a started CPU arrives from `entry`, on its own stack and with the boot CPU's page
/// tables: it takes the exception vectors and its machine index, reports in, and joins the SMP
/// run as participant `slot`.
pub extern "C" fn ap_main(slot: usize, index: usize) -> ! {
    entry::install_exception_vectors();
    cpu::set_cpu_index(index);
    // Release: the boot CPU starts the next CPU, which overwrites `START`, only after this.
    REPORTED.store(slot, Ordering::Release);
    kernel::secondary(slot)
}
