#include "comm/mpi/mpi_family.h"

#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace gradcomp::mpi {
namespace {

// A tag no gradcomp point-to-point message uses (collectives never match point-to-point messages).
constexpr int kPoisonTag = 0x6763;
constexpr int kPoisonBytes = 1024;
// How long a failing rank pushes its poison messages before leaving them to later progress (a stopped peer's socket
// may not take them now; a dead one never will).
constexpr auto kPoisonPush = std::chrono::milliseconds(100);

struct Grave {
  std::vector<MPI_Request> requests;
  std::shared_ptr<void> keep_alive;
};

std::mutex& graveyard_mutex() {
  static auto* mutex = new std::mutex;  // leaked on purpose: abandoned requests outlive every destructor
  return *mutex;
}

std::vector<Grave>& graveyard() {
  static auto* graves = new std::vector<Grave>;
  return *graves;
}

}  // namespace

void bury(std::vector<MPI_Request> requests, std::shared_ptr<void> keep_alive) {
  note_failure();
  std::lock_guard<std::mutex> lock(graveyard_mutex());
  graveyard().push_back(Grave{std::move(requests), std::move(keep_alive)});
}

std::size_t buried_count() {
  std::lock_guard<std::mutex> lock(graveyard_mutex());
  std::size_t count = 0;
  for (const Grave& grave : graveyard()) count += grave.requests.size();
  return count;
}

struct MpiFamily::Inbox {
  MPI_Request request = MPI_REQUEST_NULL;
  char text[kPoisonBytes] = {};
};

MpiFamily::MpiFamily(MPI_Comm root) : root_(root), inbox_(std::make_shared<Inbox>()) {
  MPI_Comm_set_errhandler(root_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(root_, &root_rank_);
  MPI_Comm_size(root_, &root_size_);
  const int rc = MPI_Irecv(inbox_->text, kPoisonBytes, MPI_CHAR, MPI_ANY_SOURCE, kPoisonTag, root_, &inbox_->request);
  if (rc != MPI_SUCCESS) {
    inbox_->request = MPI_REQUEST_NULL;
    fail(fmt::format("rank {} of {}: MPI_Irecv of the failure channel failed: {}", root_rank_, root_size_,
                     error_string(rc)));
  }
}

MpiFamily::~MpiFamily() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (inbox_->request != MPI_REQUEST_NULL) {
    MPI_Cancel(&inbox_->request);
    bool done = false;
    if (!broken()) {  // a cancelled receive completes locally; bounded anyway
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (!done && std::chrono::steady_clock::now() < deadline) {
        int flag = 0;
        if (MPI_Test(&inbox_->request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        done = flag != 0;
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    if (!done) bury({inbox_->request}, inbox_);
  }
  if (!broken()) MPI_Comm_free(&root_);
}

bool MpiFamily::poll() {
  if (broken()) return true;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || inbox_->request == MPI_REQUEST_NULL) return broken();
  int done = 0;
  MPI_Status status;
  if (MPI_Test(&inbox_->request, &done, &status) != MPI_SUCCESS || !done) return broken();
  inbox_->request = MPI_REQUEST_NULL;
  if (failure_.empty()) {
    failure_ = fmt::format("rank {} of {} reported: {}", status.MPI_SOURCE, root_size_,
                           std::string(inbox_->text, strnlen(inbox_->text, kPoisonBytes)));
  }
  note_failure();
  broken_.store(true, std::memory_order_release);
  return true;
}

std::string MpiFamily::fail(const std::string& what) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty()) {
      failure_ = what;
      first = true;
    }
    note_failure();
    broken_.store(true, std::memory_order_release);
  }
  if (first) send_poison(what);
  return failure();
}

std::string MpiFamily::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void MpiFamily::send_poison(const std::string& what) {
  auto text = std::make_shared<std::vector<char>>(kPoisonBytes, '\0');
  std::memcpy(text->data(), what.data(), std::min<std::size_t>(what.size(), kPoisonBytes - 1));
  std::vector<MPI_Request> pending, failed;
  for (int peer = 0; peer < root_size_; ++peer) {
    if (peer == root_rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(text->data(), kPoisonBytes, MPI_CHAR, peer, kPoisonTag, root_, &request) == MPI_SUCCESS) {
      pending.push_back(request);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + kPoisonPush;
  while (!pending.empty() && std::chrono::steady_clock::now() < deadline) {
    for (std::size_t i = 0; i < pending.size();) {
      int done = 0;
      const int rc = MPI_Test(&pending[i], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS && pending[i] != MPI_REQUEST_NULL) failed.push_back(pending[i]);
      if (rc != MPI_SUCCESS || done) {
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (!pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  pending.insert(pending.end(), failed.begin(), failed.end());
  if (!pending.empty()) bury(std::move(pending), text);  // `text` must outlive them
}

}  // namespace gradcomp::mpi
