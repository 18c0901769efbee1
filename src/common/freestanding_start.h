/* The process entry of the freestanding programs (src/init/warren_init.c,
 * src/init/warren_spawn.c: no libc, no crt): WARREN_FREESTANDING_START(fn)
 * defines _start, which calls `void fn(long* sp)` with the initial stack
 * pointer (sp[0] = argc, sp + 1 = argv) on a 16-byte aligned stack; `fn`
 * must never return. x86_64 and aarch64. */
#ifndef WARREN_COMMON_FREESTANDING_START_H_
#define WARREN_COMMON_FREESTANDING_START_H_

#if defined(__x86_64__)
#define WARREN_FREESTANDING_START(fn) \
  __asm__(                            \
      ".text\n"                       \
      ".global _start\n"              \
      "_start:\n"                     \
      "  xor %rbp, %rbp\n"            \
      "  mov %rsp, %rdi\n"            \
      "  and $-16, %rsp\n"            \
      "  call " #fn                   \
      "\n"                            \
      "  hlt\n");
#elif defined(__aarch64__)
#define WARREN_FREESTANDING_START(fn) \
  __asm__(                            \
      ".text\n"                       \
      ".global _start\n"              \
      "_start:\n"                     \
      "  mov x29, #0\n"               \
      "  mov x30, #0\n"               \
      "  mov x0, sp\n"                \
      "  bl " #fn                     \
      "\n"                            \
      "  brk #0\n");
#else
#error "freestanding programs support x86_64 and aarch64 only"
#endif

#endif /* WARREN_COMMON_FREESTANDING_START_H_ */
