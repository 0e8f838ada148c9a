// CriuService for a build without libcriu (CMake did not find criu.pc): every call fails with the way out.
#include "criu-hooks/criu_service.h"

namespace bftfs::criu {
namespace {
const char* const kNoLibcriu =
    "this bftfs was built without libcriu: run `make deps` (it installs CRIU 4.1.1 and libcriu under "
    "/opt/bftfs) and rebuild";
}  // namespace

bool CriuService::available() { return false; }

CriuService::CriuService(std::string binary, std::string config_file)
    : binary_(std::move(binary)), config_file_(std::move(config_file)) {}

std::string CriuService::dump(const DumpRequest&) const { return kNoLibcriu; }

std::string CriuService::restore_child(const RestoreRequest&, pid_t&) const { return kNoLibcriu; }

}  // namespace bftfs::criu
