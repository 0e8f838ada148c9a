// Direct I/O (O_DIRECT; docs/CLIENT.md "Direct I/O"): a direct write leaves no stale page of its range in the
// kernel's page cache of this mount, whether it came through pwrite, Linux AIO or io_uring, and whatever other
// processes read through the page cache or a mapping meanwhile.
//
// Why the daemon must act: the kernel drops the cached pages of a direct write's range before it sends the
// WRITE, and after it only for a synchronous write (generic_file_direct_write skips it for an asynchronous
// one, and FOPEN_DIRECT_IO descriptors get no second invalidation at all). A buffered reader that fills a
// page in between -- its READ reaches the service before the direct WRITE -- leaves the old bytes cached for
// good: a process that wrote 0x55 with io_submit and read the range back through the page cache got 0xaa. So
// a direct write here is synchronous (final at the service before write() or the AIO completion returns), and
// its range is invalidated after it became final, before the reply: every page of the range cached later is
// filled from the service after the write.
//
// When the notification is safe: fuse_lowlevel_notify_inval_inode locks each cached page of the range and
// waits for pages under I/O. The request's sender must not hold one of those locks while it waits for this
// reply (buffered writes do: the kernel locks the pages it copies into, then sends the WRITE). A WRITE that
// comes from the kernel's direct-I/O path holds none; that is every WRITE on a descriptor opened with O_DIRECT
// (answered FOPEN_DIRECT_IO: the kernel never uses the page cache for its reads and writes, and refuses shared
// mappings of it), and on other descriptors the WRITEs that carry a lock owner (the kernel's fuse_direct_io
// sets FUSE_WRITE_LOCKOWNER; writes from the page cache never do) with O_DIRECT among the file's flags -- the
// descriptors that fcntl(F_SETFL, O_DIRECT) switched after open.
#include "client/fuse_client_impl.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>

#include "common/assert.h"
#include "common/log.h"

namespace bftfs::client {

bool FuseClient::Impl::is_direct_write(const OpenFile* of, const fuse_file_info* fi) {
  if (fi->writepage != 0) return false;  // write-back of a mapping's dirty page: the page is locked
  if (of != nullptr && of->direct) return true;
  return (fi->flags & O_DIRECT) != 0 && fi->lock_owner != 0;
}

// Drops this mount's cached pages of [off, off + len) and the kernel's attributes of `id`; dirty pages of a
// shared mapping in the range are written back first (the kernel's launder: WRITEs that this daemon stages as
// usual). Only for requests whose sender holds no page lock (see the top of this file).
void FuseClient::Impl::invalidate_range(FuseIno id, std::uint64_t off, std::uint64_t len) {
  BFT_ASSERT(len > 0);
  const int rc = fuse_lowlevel_notify_inval_inode(se, id, static_cast<off_t>(off), static_cast<off_t>(len));
  // ENOENT: the kernel has no inode for the node (nothing cached to drop).
  if (rc != 0 && rc != -ENOENT) {
    LOG_WARN("", "client: invalidating pages of node %llu failed: %d", static_cast<unsigned long long>(id), rc);
  }
  ++stats.direct_invalidations;
}

void FuseClient::Impl::write_direct(fuse_req_t req, FuseIno id, const fs::Handle& h, const char* buf, size_t size,
                                    std::uint64_t off, const OpenFile* of, bool append) {
  BFT_ASSERT(size <= kWriteOpsPerRequest * fs::kIoBytesMax);  // write() refused larger ones
  ++stats.direct_writes;
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  // Dirty pages of a shared mapping of this range become WRITEs before this one, so the direct write lands
  // over them and not under them (kernels since 6.6 do this themselves for FOPEN_DIRECT_IO; older ones not).
  if (!append && size > 0) invalidate_range(id, off, size);
  std::uint64_t landed = off;  // where the data went (an append: where the service's end was)
  int err = 0;
  const size_t done = write_final(scope, id, h, buf, size, off, of, append, landed, err);
  if (err == EINTR) {
    // The write may still execute at any later time: no cached page of the file can be trusted after it, and
    // none at the next open.
    table.drop_data_version(id);
    request_inval(id);
  }
  if (done == 0 && err != 0) return (void)freply_err(req, err);
  drop_prefetch(id);
  // Pages that readers filled from the service before the write executed hold the old bytes: drop them.
  if (done > 0) invalidate_range(id, landed, done);
  freply_write(req, done);
}

// A read from the kernel's direct-I/O path on a descriptor opened with O_DIRECT: the kernel does not write
// back dirty pages of a shared mapping of the range first (it does for other descriptors), so this does, and
// the read sees what the mapping stored, as on a local file system.
void FuseClient::Impl::before_direct_read(const OpenFile* of, const fuse_file_info* fi, FuseIno id, size_t size,
                                          off_t off) {
  if (of == nullptr || !of->direct || fi->lock_owner == 0 || size == 0) return;  // see the top of this file
  ++stats.direct_reads;
  invalidate_range(id, static_cast<std::uint64_t>(off), size);
}

}  // namespace bftfs::client
