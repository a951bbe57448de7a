#include "runtime/profile/link_bandwidth.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/profile/timing_stats.h"

namespace tandem::profile {
namespace {

using tandem::v1::LinkDirection;

// Pinned host memory from the device, returned on destruction.
class PinnedHost {
 public:
  PinnedHost(ProfiledDevice& device, int64_t bytes) : device_(device), bytes_(bytes) {}
  ~PinnedHost() {
    if (ptr_ != nullptr) device_.FreePinnedHost(ptr_, bytes_);
  }
  absl::Status Allocate() {
    TANDEM_ASSIGN_OR_RETURN(ptr_, device_.AllocatePinnedHost(bytes_));
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }

 private:
  ProfiledDevice& device_;
  const int64_t bytes_;
  void* ptr_ = nullptr;
};

absl::StatusOr<tandem::v1::LinkProfile> MeasureOne(ProfiledDevice& device, LinkDirection direction,
                                                   bool pinned, void* host, void* on_device,
                                                   const LinkOptions& options) {
  tandem::v1::LinkProfile link;
  const bool h2d = direction == tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE;
  link.set_from_device_id(h2d ? "cpu" : device.id());
  link.set_to_device_id(h2d ? device.id() : "cpu");
  link.set_direction(direction);
  link.set_pinned(pinned);
  for (int64_t bytes : options.sizes_bytes) {
    auto copy = [&]() -> absl::Status {
      return h2d ? device.CopyToDevice(on_device, host, bytes)
                 : device.CopyToHost(host, on_device, bytes);
    };
    TANDEM_RETURN_IF_ERROR(copy());
    std::vector<double> seconds;
    for (int r = 0; r < std::max(1, options.repeats); ++r) {
      const double start = WallSeconds();
      TANDEM_RETURN_IF_ERROR(copy());
      seconds.push_back(WallSeconds() - start);
    }
    tandem::v1::BandwidthSample* sample = link.add_samples();
    const double median = Median(seconds);
    sample->set_bytes(bytes);
    sample->set_seconds(median);
    sample->set_bytes_per_second(static_cast<double>(bytes) / std::max(median, 1e-12));
  }
  if (link.samples_size() > 0) {
    link.set_bandwidth_bytes_per_second(link.samples(link.samples_size() - 1).bytes_per_second());
    link.set_latency_seconds(link.samples(0).seconds());
  }
  return link;
}

}  // namespace

absl::StatusOr<std::vector<tandem::v1::LinkProfile>> MeasureHostLinks(ProfiledDevice& device,
                                                                      const LinkOptions& options) {
  std::vector<tandem::v1::LinkProfile> links;
  if (!device.has_host_link() || options.sizes_bytes.empty()) return links;
  const int64_t max_bytes =
      *std::max_element(options.sizes_bytes.begin(), options.sizes_bytes.end());
  std::unique_ptr<Allocator> allocator = device.NewAllocator();
  TANDEM_ASSIGN_OR_RETURN(Buffer on_device,
                          Buffer::Allocate(allocator.get(), max_bytes, MemoryCategory::kWorkspace));
  std::vector<char> pageable(max_bytes, 1);
  PinnedHost pinned(device, max_bytes);
  const absl::Status pinned_status = pinned.Allocate();
  if (!pinned_status.ok() && pinned_status.code() != absl::StatusCode::kUnimplemented) {
    return pinned_status;
  }
  if (pinned.get() != nullptr) std::memset(pinned.get(), 1, max_bytes);
  for (LinkDirection direction :
       {tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST}) {
    for (bool use_pinned : {false, true}) {
      void* host = use_pinned ? pinned.get() : pageable.data();
      if (host == nullptr) continue;
      TANDEM_ASSIGN_OR_RETURN(
          tandem::v1::LinkProfile link,
          MeasureOne(device, direction, use_pinned, host, on_device.data(), options));
      links.push_back(std::move(link));
    }
  }
  return links;
}

}  // namespace tandem::profile
