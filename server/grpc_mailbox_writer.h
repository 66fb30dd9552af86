// MailboxWriter<T> is the server-streaming reactor that drains a
// StreamMailbox<T> onto a gRPC stream (assignments to a worker, job status to
// a watcher). It finishes after a message for which `is_last` is true, when
// the client cancels, or when the server shuts down. Owns itself (the
// reactor pattern's `delete this` in OnDone).
#ifndef SHARDLINE_SERVER_GRPC_MAILBOX_WRITER_H_
#define SHARDLINE_SERVER_GRPC_MAILBOX_WRITER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>

#include "server/stream_mailbox.h"

namespace shardline::server {

template <typename T>
class MailboxWriter final : public grpc::ServerWriteReactor<T> {
 public:
  MailboxWriter(std::shared_ptr<StreamMailbox<T>> mailbox, std::function<bool(const T&)> is_last)
      : mailbox_(std::move(mailbox)), is_last_(std::move(is_last)) {
    mailbox_->Attach([this](const T* message) {
      last_in_flight_ = is_last_(*message);
      this->StartWrite(message);
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok || last_in_flight_ || cancelled_) {
      mailbox_->Close();
      mailbox_->Written(ok);
      FinishOnce(grpc::Status::OK);
      return;
    }
    mailbox_->Written(ok);
  }

  void OnCancel() override {
    cancelled_ = true;
    if (!mailbox_->Close()) FinishOnce(grpc::Status::CANCELLED);  // else OnWriteDone finishes
  }

  void OnDone() override {
    mailbox_->Detach();
    delete this;
  }

 private:
  void FinishOnce(const grpc::Status& status) {
    if (!finished_.exchange(true)) this->Finish(status);
  }

  const std::shared_ptr<StreamMailbox<T>> mailbox_;
  const std::function<bool(const T&)> is_last_;
  std::atomic<bool> last_in_flight_{false};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> finished_{false};
};

// A server stream refused at once with `status`.
template <typename T>
class RejectedWriter final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RejectedWriter(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_GRPC_MAILBOX_WRITER_H_
