// The floor of the client CPU per batch on this machine (see the "client CPU"
// note in docs/benchmarks.md). Build: gcc -O2 -pthread ring_round.c -o ring_round
// Run: ./ring_round MODE BATCHES WORK_US GRANTS [FILL_MB]   e.g. ./ring_round 1 3000 700 4 10

// Floor of per-batch client CPU on this machine: the client receives one
// small message per "batch" from another process and answers with one.
// mode 1: client blocks in read() on the socket itself (1 wake per batch).
// mode 2: a reader thread blocks in read(), hands over to a consumer thread
//         via futex (condvar), consumer writes the grant (2 wakes per batch).
// mode 3: like 2, but the consumer hands the grant back to the reader thread
//         (which then writes): 3 cross-thread wakes, like the current client.
// The "worker" process spins WORK_US between grant and filled; with FILL_MB
// it first writes that many MB (a memset, like a Loader worker collating a
// 9.6 MB batch), which also evicts the client's data from the shared caches.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <string.h>
#include <poll.h>

static int N = 20000, WORK_US = 700, K = 1; static long FILL = 0; static char *fillbuf;
static double now_us(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static double cpu_us(void){struct rusage u;getrusage(RUSAGE_SELF,&u);return u.ru_utime.tv_sec*1e6+u.ru_utime.tv_usec+u.ru_stime.tv_sec*1e6+u.ru_stime.tv_usec;}
static void worker(int fd){char b[16];for(int i=0;i<N;i++){ if(read(fd,b,12)<=0) exit(1); double t=now_us(); if(FILL) memset(fillbuf,(char)i,FILL); while(now_us()-t<WORK_US); write(fd,b,12);} exit(0);}

static pthread_mutex_t m=PTHREAD_MUTEX_INITIALIZER; static pthread_cond_t c1=PTHREAD_COND_INITIALIZER,c2=PTHREAD_COND_INITIALIZER;
static int have=0, grant=0, sfd; static int mode;
static void* reader(void*a){char b[16];
  for(int i=0;i<N;i++){
    if(mode==1){ struct pollfd p={sfd,POLLIN,0}; poll(&p,1,-1); read(sfd,b,12); write(sfd,b,12); continue;}
    struct pollfd p={sfd,POLLIN,0}; poll(&p,1,-1); read(sfd,b,12);
    pthread_mutex_lock(&m); have++; pthread_cond_signal(&c1);
    if(mode==3){ while(!grant) pthread_cond_wait(&c2,&m); grant--; pthread_mutex_unlock(&m); write(sfd,b,12);} else pthread_mutex_unlock(&m);
  } return 0;}
static void* consumer(void*a){char b[12]={0};
  for(int i=0;i<N;i++){ pthread_mutex_lock(&m); while(!have) pthread_cond_wait(&c1,&m); have--;
    if(mode==3){grant++; pthread_cond_signal(&c2); pthread_mutex_unlock(&m);} else {pthread_mutex_unlock(&m); write(sfd,b,12);} }
  return 0;}
int main(int argc,char**argv){ mode=atoi(argv[1]); if(argc>2)N=atoi(argv[2]); if(argc>3)WORK_US=atoi(argv[3]); if(argc>4)K=atoi(argv[4]); if(argc>5){FILL=atol(argv[5])<<20; if(FILL){fillbuf=malloc(FILL); memset(fillbuf,1,FILL);}}
  int sv[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sv); char b[12]={0};
  if(fork()==0){close(sv[0]);worker(sv[1]);} close(sv[1]); sfd=sv[0];
  double c0=cpu_us(), w0=now_us();
  for(int k=0;k<K;k++) write(sfd,b,12); // first grants
  pthread_t r,cth; pthread_create(&r,0,reader,0); if(mode!=1) pthread_create(&cth,0,consumer,0);
  pthread_join(r,0); if(mode!=1) pthread_join(cth,0);
  double c=cpu_us()-c0, w=now_us()-w0; wait(0);
  struct rusage u; getrusage(RUSAGE_SELF,&u);
  printf("mode %d: %.2f us client CPU per batch, %.1f us wall per batch, nvcsw/batch %.2f\n",mode,c/N,w/N,(double)u.ru_nvcsw/N);
}
