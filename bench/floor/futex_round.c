// The floor of one sleep and one wake-up per batch across processes, with
// nothing else: the client sleeps in FUTEX_WAIT on a word in shared memory;
// the "worker" process spins WORK_US (after writing FILL_MB, like a worker
// collating a batch), bumps the word and FUTEX_WAKEs. No socket, no grant.
// Build: gcc -O2 futex_round.c -o futex_round
// Run:   ./futex_round BATCHES WORK_US [FILL_MB]   e.g. ./futex_round 3000 700 10
#define _GNU_SOURCE
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static double cpu_us(void) {
  struct rusage u; getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_sec * 1e6 + u.ru_stime.tv_usec;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3000, work = argc > 2 ? atoi(argv[2]) : 700;
  long fill = argc > 3 ? atol(argv[3]) << 20 : 0;
  _Atomic int *word = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (word == MAP_FAILED) return 1;
  if (fork() == 0) {
    char *buf = fill ? malloc(fill) : 0;
    if (buf) memset(buf, 1, fill);
    for (int i = 1; i <= n; i++) {
      double t = now_us();
      if (buf) memset(buf, i, fill);
      while (now_us() - t < work) {}
      atomic_store(word, i);
      syscall(SYS_futex, word, FUTEX_WAKE, 1, 0, 0, 0);
    }
    exit(0);
  }
  double c0 = cpu_us(), t0 = now_us();
  long sleeps = 0;
  for (int i = 1; i <= n; i++) {
    int v;
    while ((v = atomic_load(word)) < i) { sleeps++; syscall(SYS_futex, word, FUTEX_WAIT, v, 0, 0, 0); }
  }
  double c = cpu_us() - c0, t = now_us() - t0;
  wait(0);
  printf("futex: %.2f us client CPU per batch, %.1f us wall per batch, sleeps/batch %.2f\n", c / n, t / n, (double)sleeps / n);
  return 0;
}
