// pv_fiber_switch(void** save_sp, void* load_sp): saves the callee-saved registers of the running
// context on its own stack, stores the stack pointer in *save_sp, and resumes the context whose
// stack pointer is load_sp. x86-64 System V: rbx, rbp and r12-r15 are callee-saved; everything
// else the caller already treats as clobbered.
//
// The MXCSR and x87 control word are deliberately not switched: all fibers of a worker share the
// worker's floating-point environment, as all CUDA threads run in one fixed mode (CUDA has no way
// to change rounding modes). Switching them cost 3x: MXCSR also holds sticky exception flags,
// which differ between contexts as soon as one computes a NaN, and ldmxcsr with a different
// value serialises the pipeline (measured: 85 ns vs 24 ns per emulated thread).
//
// The resume ends with pop + jmp rather than ret: a ret to an address the return-stack buffer
// did not predict costs ~2x (measured, host-platform-facts.md).
//
// Frame layout from the saved stack pointer upward:
//   [0] r15  [8] r14  [16] r13  [24] r12  [32] rbx  [40] rbp  [48] resume address
// A new fiber's frame (fiber.cpp) puts its entry function in r13, its argument in r12 and
// pv_fiber_trampoline as the resume address.
        .text
        .globl  pv_fiber_switch
        .type   pv_fiber_switch, @function
pv_fiber_switch:
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        popq    %rcx
        jmpq    *%rcx
        .size   pv_fiber_switch, .-pv_fiber_switch

// First code a new fiber runs: rsp is 16-byte aligned here, so the call leaves the entry
// function with the ABI's alignment. The entry function never returns.
        .globl  pv_fiber_trampoline
        .type   pv_fiber_trampoline, @function
pv_fiber_trampoline:
        movq    %r12, %rdi
        callq   *%r13
        ud2
        .size   pv_fiber_trampoline, .-pv_fiber_trampoline

        .section .note.GNU-stack,"",@progbits
