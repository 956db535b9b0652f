//! The running CPU: its APIC id, its machine CPU index, its page-table root, and the model-specific
//! registers the kernel reads.
//!
//! The machine CPU index lives in `IA32_GS_BASE`, as the aarch64 side keeps it in `TPIDR_EL1`:
//! nothing in this kernel addresses memory through `gs`, the register is per CPU, and its value
//! is 0 until set (at reset, and after the entry code loads the flat data selector into `gs`),
//! which is the index the boot CPU reports until it knows its own.

use core::arch::asm;

/// `IA32_APIC_BASE`: the local APIC's physical base and mode bits.
const IA32_APIC_BASE: u32 = 0x1b;
/// `IA32_GS_BASE`: the `gs` segment base, here the machine CPU index.
const IA32_GS_BASE: u32 = 0xc000_0101;

/// Reads one of the registers named above.
fn read_msr(msr: u32) -> u64 {
    let (low, high): (u32, u32);
    // SAFETY: every caller passes one of this module's MSRs, which every x86_64 CPU has; reading
    // them has no side effect.
    unsafe {
        asm!(
            "rdmsr",
            in("ecx") msr,
            out("eax") low,
            out("edx") high,
            options(nomem, nostack, preserves_flags)
        )
    };
    (u64::from(high) << 32) | u64::from(low)
}

/// The initial APIC id of the running CPU (CPUID leaf 1, EBX bits 31..24).
pub fn apic_id() -> u32 {
    let r = core::arch::x86_64::__cpuid(1);
    r.ebx >> 24
}

/// `IA32_APIC_BASE` of the running CPU.
pub fn apic_base_msr() -> u64 {
    read_msr(IA32_APIC_BASE)
}

/// The machine CPU index of the running CPU.
pub fn cpu_index() -> usize {
    read_msr(IA32_GS_BASE) as usize
}

/// Records `index` as the running CPU's machine CPU index.
pub fn set_cpu_index(index: usize) {
    let v = index as u64;
    // SAFETY: `IA32_GS_BASE` exists on every x86_64 CPU and nothing in this kernel addresses
    // memory through `gs` (see the module comment), so its value only changes what `cpu_index`
    // reads.
    unsafe {
        asm!(
            "wrmsr",
            in("ecx") IA32_GS_BASE,
            in("eax") v as u32,
            in("edx") (v >> 32) as u32,
            options(nomem, nostack, preserves_flags)
        )
    };
}

/// The physical address of the running CPU's PML4 (CR3).
pub fn cr3() -> u64 {
    let v: u64;
    // SAFETY: reading CR3 has no side effect.
    unsafe { asm!("mov {}, cr3", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v
}
