/* One system call without libc: the number and up to six arguments in the
 * kernel's registers, the raw result back (-errno on failure; errno is never
 * touched). C and C++, no dependency beyond the compiler: shared by the
 * freestanding programs (src/init/warren_init.c, the fncall zygote helper
 * src/runtime/fncall/zygote_helper.c) and by jail::RawSyscall (syscalls.h),
 * which code running on a borrowed thread's TLS uses. Async-signal-safe.
 * Defines WARREN_HAVE_RAW_SYSCALL on x86_64 and aarch64, the architectures
 * it knows; elsewhere callers fall back (or refuse to build). */
#ifndef WARREN_COMMON_RAW_SYSCALL_H_
#define WARREN_COMMON_RAW_SYSCALL_H_

#if defined(__x86_64__)
#define WARREN_HAVE_RAW_SYSCALL 1
static inline long warren_raw_syscall6(long n, long a, long b, long c, long d, long e, long f) {
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
#define WARREN_HAVE_RAW_SYSCALL 1
static inline long warren_raw_syscall6(long n, long a, long b, long c, long d, long e, long f) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
  return x0;
}
#endif

#endif /* WARREN_COMMON_RAW_SYSCALL_H_ */
