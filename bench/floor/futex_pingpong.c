// Build: gcc -O2 -pthread futex_pingpong.c -o futex_pingpong; run: ./futex_pingpong 20000

// Two threads of one process hand a token back and forth through futexes:
// process CPU per hand-over = the cost of one cross-thread wake-up (waker's
// FUTEX_WAKE + wakee's sleep/schedule-in) on this machine.
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static _Atomic int turn = 0; static int N = 20000;
static void fwait(int v){ while(atomic_load(&turn)==v) syscall(SYS_futex,&turn,FUTEX_WAIT_PRIVATE,v,0,0,0);}
static void fwake(int v){ atomic_store(&turn,v); syscall(SYS_futex,&turn,FUTEX_WAKE_PRIVATE,1,0,0,0);}
static void* other(void*a){ for(int i=0;i<N;i++){ fwait(0); fwake(0);} return 0;}
static double cpu(void){struct rusage u;getrusage(RUSAGE_SELF,&u);return u.ru_utime.tv_sec*1e6+u.ru_utime.tv_usec+u.ru_stime.tv_sec*1e6+u.ru_stime.tv_usec;}
int main(int c,char**v){ if(c>1)N=atoi(v[1]); pthread_t t; double c0=cpu(); struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
  pthread_create(&t,0,other,0);
  for(int i=0;i<N;i++){ fwake(1); fwait(1);} pthread_join(t,0);
  clock_gettime(CLOCK_MONOTONIC,&b); double w=(b.tv_sec-a.tv_sec)*1e6+(b.tv_nsec-a.tv_nsec)/1e3;
  struct rusage u; getrusage(RUSAGE_SELF,&u);
  printf("futex ping-pong: %.2f us CPU per wake-up (%.2f us wall), %ld voluntary switches over %d wake-ups\n",(cpu()-c0)/(2.0*N), w/(2.0*N), u.ru_nvcsw, 2*N);
}
