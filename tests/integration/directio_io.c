// directio_io: runs a sequence of I/O operations on one file through every path the kernel offers -- O_DIRECT
// with pread/pwrite, Linux AIO (io_submit) and io_uring, buffered pread/pwrite, and a shared mapping -- and
// prints one line per read (and per failed operation), so that the same sequence run on a local directory and
// on a bftfs mount can be compared line by line and byte by byte (tests/integration/test_mount_direct_io.py).
//
// Usage: directio_io FILE OP...
//   OP is KIND:OFFSET:LENGTH[:BYTE] (numbers in decimal; BYTE in hex fills the written range):
//     dw dr   O_DIRECT pwrite / pread
//     aw ar   O_DIRECT through Linux AIO (io_setup/io_submit/io_getevents), waiting for the completion
//     uw ur   O_DIRECT through io_uring (IORING_OP_WRITE / IORING_OP_READ), waiting for the completion
//     bw br   buffered pwrite / pread
//     mw mr   a store to / a load from a MAP_SHARED mapping of the file's first LENGTH bytes (made at first use)
//   and the operations without arguments:
//     sync    msync(MS_SYNC) of the mapping, then fsync
//     reopen  closes every descriptor and the mapping, then opens the file again (close-to-open)
//     setfl   replaces the direct descriptor by one opened without O_DIRECT and switched to it by
//             fcntl(F_SETFL, O_DIRECT) (the way some databases ask for direct I/O)
// A read prints "KIND OFFSET LENGTH n=BYTES h=FNV1A64"; a failure prints "KIND OFFSET LENGTH err=ERRNO" and the
// sequence goes on. Offsets and lengths of the direct kinds must be multiples of 4096 (the alignment local file
// systems ask for). The asynchronous kinds use raw system calls, so no library beyond libc is needed.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

enum { kAlign = 4096 };

static const char* g_path;
static int g_direct = -1;    // O_RDWR | O_DIRECT
static int g_buffered = -1;  // O_RDWR
static unsigned char* g_map = NULL;
static size_t g_map_len = 0;

static uint64_t fnv1a64(const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static void die(const char* what) {
  fprintf(stderr, "directio_io: %s: %s\n", what, strerror(errno));
  exit(2);
}

static void open_all(void) {
  g_direct = open(g_path, O_RDWR | O_DIRECT);
  if (g_direct < 0) die("open O_DIRECT");
  g_buffered = open(g_path, O_RDWR);
  if (g_buffered < 0) die("open");
}

static void close_all(void) {
  if (g_map != NULL && munmap(g_map, g_map_len) != 0) die("munmap");
  g_map = NULL;
  g_map_len = 0;
  if (close(g_direct) != 0) die("close O_DIRECT");
  if (close(g_buffered) != 0) die("close");
}

// ---- Linux AIO through raw system calls ----

static aio_context_t g_aio = 0;

static ssize_t aio_rw(int write, void* buf, size_t len, off_t off) {
  if (g_aio == 0 && syscall(SYS_io_setup, 4, &g_aio) != 0) die("io_setup");
  struct iocb cb;
  memset(&cb, 0, sizeof(cb));
  cb.aio_fildes = (uint32_t)g_direct;
  cb.aio_lio_opcode = write ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
  cb.aio_buf = (uint64_t)(uintptr_t)buf;
  cb.aio_nbytes = len;
  cb.aio_offset = off;
  struct iocb* list[1] = {&cb};
  if (syscall(SYS_io_submit, g_aio, 1, list) != 1) return -errno;
  struct io_event ev;
  long got;
  do {
    got = syscall(SYS_io_getevents, g_aio, 1, 1, &ev, NULL);
  } while (got < 0 && errno == EINTR);
  if (got != 1) die("io_getevents");
  return (ssize_t)ev.res;
}

// ---- io_uring through raw system calls: one ring, one request at a time ----

struct Ring {
  int fd;
  unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
  unsigned *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe* sqes;
  struct io_uring_cqe* cqes;
};
static struct Ring g_ring = {-1, 0, 0, 0, 0, 0, 0, 0, 0, 0};

static void ring_setup(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  g_ring.fd = (int)syscall(SYS_io_uring_setup, 4, &p);
  if (g_ring.fd < 0) die("io_uring_setup");
  size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  unsigned char* sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g_ring.fd,
                           IORING_OFF_SQ_RING);
  if (sq == MAP_FAILED) die("mmap sq ring");
  unsigned char* cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g_ring.fd,
                           IORING_OFF_CQ_RING);
  if (cq == MAP_FAILED) die("mmap cq ring");
  g_ring.sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_POPULATE, g_ring.fd, IORING_OFF_SQES);
  if (g_ring.sqes == MAP_FAILED) die("mmap sqes");
  g_ring.sq_head = (unsigned*)(sq + p.sq_off.head);
  g_ring.sq_tail = (unsigned*)(sq + p.sq_off.tail);
  g_ring.sq_mask = (unsigned*)(sq + p.sq_off.ring_mask);
  g_ring.sq_array = (unsigned*)(sq + p.sq_off.array);
  g_ring.cq_head = (unsigned*)(cq + p.cq_off.head);
  g_ring.cq_tail = (unsigned*)(cq + p.cq_off.tail);
  g_ring.cq_mask = (unsigned*)(cq + p.cq_off.ring_mask);
  g_ring.cqes = (struct io_uring_cqe*)(cq + p.cq_off.cqes);
}

static ssize_t uring_rw(int write, void* buf, size_t len, off_t off) {
  if (g_ring.fd < 0) ring_setup();
  unsigned tail = *g_ring.sq_tail;
  unsigned idx = tail & *g_ring.sq_mask;
  struct io_uring_sqe* sqe = &g_ring.sqes[idx];
  memset(sqe, 0, sizeof(*sqe));
  sqe->opcode = write ? IORING_OP_WRITE : IORING_OP_READ;
  sqe->fd = g_direct;
  sqe->addr = (uint64_t)(uintptr_t)buf;
  sqe->len = (uint32_t)len;
  sqe->off = (uint64_t)off;
  g_ring.sq_array[idx] = idx;
  __atomic_store_n(g_ring.sq_tail, tail + 1, __ATOMIC_RELEASE);
  if (syscall(SYS_io_uring_enter, g_ring.fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) die("io_uring_enter");
  unsigned head = *g_ring.cq_head;
  while (head == __atomic_load_n(g_ring.cq_tail, __ATOMIC_ACQUIRE)) {
    if (syscall(SYS_io_uring_enter, g_ring.fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 && errno != EINTR) {
      die("io_uring_enter (wait)");
    }
  }
  ssize_t res = g_ring.cqes[head & *g_ring.cq_mask].res;
  __atomic_store_n(g_ring.cq_head, head + 1, __ATOMIC_RELEASE);
  return res;
}

// ---- the operations ----

static int ensure_map(size_t len) {
  if (g_map != NULL && g_map_len >= len) return 0;
  if (g_map != NULL && munmap(g_map, g_map_len) != 0) die("munmap");
  void* m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, g_buffered, 0);
  if (m == MAP_FAILED) {
    g_map = NULL;
    return -errno;
  }
  g_map = m;
  g_map_len = len;
  return 0;
}

// Runs one data operation; returns the bytes transferred or a negative errno.
static ssize_t run(const char* kind, unsigned char* buf, size_t len, off_t off) {
  const int write = kind[1] == 'w';
  switch (kind[0]) {
    case 'd': {
      ssize_t n = write ? pwrite(g_direct, buf, len, off) : pread(g_direct, buf, len, off);
      return n < 0 ? -errno : n;
    }
    case 'b': {
      ssize_t n = write ? pwrite(g_buffered, buf, len, off) : pread(g_buffered, buf, len, off);
      return n < 0 ? -errno : n;
    }
    case 'a': return aio_rw(write, buf, len, off);
    case 'u': return uring_rw(write, buf, len, off);
    case 'm': {
      int e = ensure_map((size_t)off + len);
      if (e != 0) return e;
      if (write) memcpy(g_map + off, buf, len);
      else memcpy(buf, g_map + off, len);
      return (ssize_t)len;
    }
  }
  fprintf(stderr, "directio_io: unknown kind %s\n", kind);
  exit(2);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: directio_io FILE KIND:OFFSET:LENGTH[:BYTE]... | sync | reopen | setfl\n");
    return 2;
  }
  g_path = argv[1];
  open_all();
  for (int i = 2; i < argc; ++i) {
    if (strcmp(argv[i], "reopen") == 0) {
      close_all();
      open_all();
      continue;
    }
    if (strcmp(argv[i], "setfl") == 0) {
      if (close(g_direct) != 0) die("close O_DIRECT");
      g_direct = open(g_path, O_RDWR);
      if (g_direct < 0) die("open");
      if (fcntl(g_direct, F_SETFL, O_DIRECT) != 0) die("fcntl F_SETFL O_DIRECT");
      continue;
    }
    if (strcmp(argv[i], "sync") == 0) {
      if (g_map != NULL && msync(g_map, g_map_len, MS_SYNC) != 0) printf("msync err=%d\n", errno);
      if (fsync(g_buffered) != 0) printf("fsync err=%d\n", errno);
      continue;
    }
    char kind[3] = {0};
    unsigned long long off = 0, len = 0;
    unsigned fill = 0;
    int fields = sscanf(argv[i], "%2[a-z]:%llu:%llu:%x", kind, &off, &len, &fill);
    if (fields < 3 || strlen(kind) != 2 || (kind[1] != 'w' && kind[1] != 'r') || (kind[1] == 'w' && fields != 4)) {
      fprintf(stderr, "directio_io: bad operation %s\n", argv[i]);
      return 2;
    }
    unsigned char* buf = NULL;
    if (posix_memalign((void**)&buf, kAlign, len == 0 ? kAlign : len) != 0) die("posix_memalign");
    memset(buf, kind[1] == 'w' ? (int)fill : 0, len);
    ssize_t n = run(kind, buf, (size_t)len, (off_t)off);
    if (n < 0) {
      printf("%s %llu %llu err=%d\n", kind, off, len, (int)-n);
    } else if (kind[1] == 'r') {
      printf("%s %llu %llu n=%zd h=%016llx\n", kind, off, len, n,
             (unsigned long long)fnv1a64(buf, (size_t)n));
    } else if ((size_t)n != len) {
      printf("%s %llu %llu short=%zd\n", kind, off, len, n);
    }
    free(buf);
    fflush(stdout);
  }
  close_all();
  return 0;
}
