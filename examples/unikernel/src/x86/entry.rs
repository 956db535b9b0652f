//! The entries: the PVH entry of the boot CPU, the real-mode trampoline the other CPUs start
//! in, the switch from 32-bit protected mode to long mode over a boot identity map that both
//! share, and the exception vectors.
//!
//! QEMU's `-kernel` boots an ELF that carries a `XEN_ELFNOTE_PHYS32_ENTRY` note through its
//! PVH option ROM: flat 32-bit protected mode, paging off, interrupts off, `ebx` holding the
//! physical address of the `hvm_start_info`. The entry zeroes `.bss`, identity-maps the first
//! 64 GiB with 2 MiB pages (tables in `.bss`, see `link-x86_64.ld`), enables PAE, long mode and
//! paging, loads a 64-bit GDT and calls `kmain(start_info)` on the image's stack. numaframe's
//! metadata and frames are reached through that map until `paging` replaces it.
//!
//! Another CPU starts from a STARTUP IPI in 16-bit real mode at offset 0 of the page the IPI
//! names, with `cs` that page's segment. `smp` copies the trampoline (`ap_trampoline` ..
//! `ap_trampoline_end`, position-independent: it uses only `cs`-relative and absolute addresses
//! below 4 GiB) to a page below 1 MiB. It loads the boot GDT, turns protection on and jumps into
//! the image in 32-bit mode, where the CPU takes the boot CPU's way into long mode over the boot
//! map (the boot CPU's own tables may lie above 4 GiB, out of reach of a 32-bit `cr3` load).
//! In long mode it loads the boot CPU's CR3, stack top, SMP slot and machine CPU index from
//! `smp::START` and calls `smp::ap_main(slot, cpu)`.

use core::arch::{asm, global_asm};

use crate::kernel::fail;

/// Bytes the boot map covers.
pub const BOOT_MAP_BYTES: u64 = 64 << 30;

global_asm!(
    r#"
    .pushsection .note.Xen, "a", @note
    .balign 4
    .long 4
    .long 8
    .long 18
    .asciz "Xen"
    .balign 4
    .quad _pvh_start
    .popsection

    /* From 32-bit protected mode with paging off: the boot map in CR3, PAE, long mode and
       paging on, the boot GDT, and a far jump to the 64-bit code at `target`. */
    .macro enter_long_mode target
    mov     $boot_pml4, %eax
    mov     %eax, %cr3
    mov     %cr4, %eax
    or      $0x20, %eax
    mov     %eax, %cr4
    mov     $0xc0000080, %ecx
    rdmsr
    or      $0x100, %eax
    wrmsr
    mov     %cr0, %eax
    or      $0x80000001, %eax
    mov     %eax, %cr0
    lgdt    boot_gdt_ptr
    ljmp    $0x08, $\target
    .endm

    /* The other CPUs' real-mode start, copied below 1 MiB by `smp`. */
    .pushsection .rodata.ap_trampoline, "a"
    .code16
    .balign 16
    .global ap_trampoline
    .global ap_trampoline_end
ap_trampoline:
    cli
    cld
    mov     %cs, %ax
    mov     %ax, %ds
    lgdtl   ap_gdt_ptr - ap_trampoline
    /* Protection on, and nothing else: INIT leaves the caches off (CD and NW set in CR0). */
    mov     $0x11, %eax
    mov     %eax, %cr0
    ljmpl   $0x18, $ap_protected
    .balign 4
ap_gdt_ptr:
    .word   boot_gdt_ptr - boot_gdt - 1
    .long   boot_gdt
ap_trampoline_end:
    .popsection

    .pushsection .text.boot, "ax"
    .code32
ap_protected:
    mov     $0x10, %ax
    mov     %ax, %ds
    mov     %ax, %es
    mov     %ax, %ss
    enter_long_mode 6f

    .code64
6:  mov     $0x10, %ax
    mov     %ax, %ds
    mov     %ax, %es
    mov     %ax, %ss
    mov     %ax, %fs
    mov     %ax, %gs
    mov     {start}(%rip), %rax
    mov     %rax, %cr3
    mov     {start}+8(%rip), %rsp
    mov     {start}+16(%rip), %rdi
    mov     {start}+24(%rip), %rsi
    call    {ap_main}
    jmp     4f

    .code32
    .global _pvh_start
_pvh_start:
    cli
    cld
    mov     %ebx, %esi
    mov     $__bss_start, %edi
    mov     $__bss_end, %ecx
    sub     %edi, %ecx
    xor     %eax, %eax
    rep stosb

    /* 64 page directories of 2 MiB pages: entry i maps i << 21. */
    mov     $boot_pd, %edi
    xor     %ecx, %ecx
1:  mov     %ecx, %eax
    shl     $21, %eax
    or      $0x83, %eax
    mov     %eax, (%edi, %ecx, 8)
    mov     %ecx, %eax
    shr     $11, %eax
    mov     %eax, 4(%edi, %ecx, 8)
    inc     %ecx
    cmp     $(64 * 512), %ecx
    jb      1b
    mov     $boot_pdpt, %edi
    xor     %ecx, %ecx
2:  mov     %ecx, %eax
    shl     $12, %eax
    add     $boot_pd, %eax
    or      $0x3, %eax
    mov     %eax, (%edi, %ecx, 8)
    inc     %ecx
    cmp     $64, %ecx
    jb      2b
    mov     $boot_pdpt, %eax
    or      $0x3, %eax
    mov     %eax, boot_pml4

    enter_long_mode 3f

    .code64
3:  mov     $0x10, %ax
    mov     %ax, %ds
    mov     %ax, %es
    mov     %ax, %ss
    mov     %ax, %fs
    mov     %ax, %gs
    lea     __stack_top(%rip), %rsp
    mov     %esi, %edi
    call    {kmain}
4:  hlt
    jmp     4b

    /* Exception stubs, 16 bytes apart from `exception_stubs`: push a zero where the CPU
       pushes no error code, then the vector. */
    .macro stub n
    .balign 16
stub\n:
    .if (\n == 8) || (\n >= 10 && \n <= 14) || (\n == 17) || (\n == 21) || (\n == 29) || (\n == 30)
    .else
    push    $0
    .endif
    push    $\n
    jmp     5f
    .endm
    .altmacro
    .balign 16
    .global exception_stubs
exception_stubs:
    .set n, 0
    .rept 32
    stub %n
    .set n, n + 1
    .endr
5:  mov     (%rsp), %rdi
    mov     8(%rsp), %rsi
    mov     16(%rsp), %rdx
    mov     %cr2, %rcx
    and     $-16, %rsp
    call    {exception}
    .popsection

    .noaltmacro

    .pushsection .rodata
    .balign 8
boot_gdt:
    .quad 0
    .quad 0x00af9a000000ffff
    .quad 0x00cf92000000ffff
    /* 0x18: 32-bit code, for the other CPUs' way from real mode. */
    .quad 0x00cf9a000000ffff
boot_gdt_ptr:
    .word boot_gdt_ptr - boot_gdt - 1
    .long boot_gdt
    .popsection
"#,
    kmain = sym super::kmain,
    start = sym super::smp::START,
    ap_main = sym super::smp::ap_main,
    exception = sym exception,
    options(att_syntax)
);

unsafe extern "C" {
    /// The first of the 32 exception stubs; stub `n` starts `16 * n` bytes later.
    fn exception_stubs();
}

/// An interrupt gate: 16 bytes.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Gate([u64; 2]);

static IDT: spin::Once<[Gate; 32]> = spin::Once::new();

/// Installs gates for the 32 exception vectors; each prints the vector, error code, RIP and
/// CR2 and stops the machine, instead of a silent triple fault.
pub fn install_exception_vectors() {
    let idt = IDT.call_once(|| {
        let mut idt = [Gate([0; 2]); 32];
        let first = (exception_stubs as *const ()).addr() as u64;
        for (n, gate) in idt.iter_mut().enumerate() {
            let stub = first + 16 * n as u64;
            let low = (stub & 0xffff) | (0x08 << 16) | (0x8e << 40) | ((stub >> 16) & 0xffff) << 48;
            *gate = Gate([low, stub >> 32]);
        }
        idt
    });
    let pointer: [u16; 5] = {
        let base = (idt.as_ptr() as u64).to_le_bytes();
        let word = |i: usize| u16::from_le_bytes([base[i], base[i + 1]]);
        [(32 * 16 - 1) as u16, word(0), word(2), word(4), word(6)]
    };
    // SAFETY: the IDT is static, its gates point at the stubs in this image with the boot GDT's
    // code selector; `lidt` reads the 10-byte pointer.
    unsafe {
        asm!("lidt [{}]", in(reg) pointer.as_ptr(), options(readonly, nostack, preserves_flags))
    };
}

extern "C" fn exception(vector: u64, error: u64, rip: u64, cr2: u64) -> ! {
    fail!(
        "cpu{}: exception {vector}: error code {error:#x} RIP {rip:#x} CR2 {cr2:#x}",
        super::cpu::cpu_index()
    )
}
