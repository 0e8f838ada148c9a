// write() without write-behind (FuseClient::Impl::synchronous_writes): the spec session of a speculating
// `bftfs run` answers each write() only once its WRITE has a result. There the result comes from the local
// model at once, so nothing is gained by staging; and a write answered before a checkpoint's seal must be an
// entry of the sealed epoch, which a write still staged in the daemon would not be (docs/SPECULATION.md §6.1,
// invariant I7).
#include "client/fuse_client_impl.h"

#include <algorithm>

#include "common/assert.h"

namespace bftfs::client {

void FuseClient::Impl::write_sync(fuse_req_t req, FuseIno id, const fs::Handle& h, const char* buf, size_t size,
                                  std::uint64_t off, const OpenFile* of, bool append) {
  BFT_ASSERT(size <= kWriteOpsPerRequest * fs::kIoBytesMax);  // write() refused larger ones
  InterruptScope scope(req, table, stopping, ignore_interrupts);
  std::uint64_t landed = off;  // where the data went (an append: where the service's end was)
  int err = 0;
  const size_t done = write_final(scope, id, h, buf, size, off, of, append, landed, err);
  if (done == 0 && err != 0) return (void)freply_err(req, err);
  drop_prefetch(id);
  // An append that landed elsewhere than the kernel put it (another writer appended meanwhile): the cached
  // pages of the file are wrong. The sender holds page locks, so they are dropped by the invalidation thread.
  if (append && landed != off) {
    table.drop_data_version(id);
    request_inval(id);
  }
  freply_write(req, done);
}

size_t FuseClient::Impl::write_final(InterruptScope& scope, FuseIno id, const fs::Handle& h, const char* buf,
                                     size_t size, std::uint64_t off, const OpenFile* of, bool append,
                                     std::uint64_t& landed, int& err) {
  const fs::Cred cred = io_cred(of, id, 2);
  size_t done = 0;
  do {
    const size_t n = std::min<size_t>(fs::kIoBytesMax, size - done);
    fs::Op op = make_op(OpCode::kWrite, cred);
    op.handle = h;
    op.append = append;
    op.offset = append ? 0 : off + done;
    op.data.assign(reinterpret_cast<const std::uint8_t*>(buf) + done,
                   reinterpret_cast<const std::uint8_t*>(buf) + done + n);
    // call() sends this file's staged writes first: they execute before this one (submission order).
    CallResult r = call(&scope, single(std::move(op)), false);
    if (r.err != 0) {
      err = r.err;
      return done;  // what was written stands (a short write), or nothing was
    }
    const fs::Attr& attr = r.result.results[0].attr;
    table.update_attr(attr, r.seq);
    if (append && done == 0) landed = attr.size >= n ? attr.size - n : 0;
    done += n;
  } while (done < size);
  return done;
}

}  // namespace bftfs::client
