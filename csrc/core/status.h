// The core's error type: a code that says which TensorFlow error (or Python
// exception) a failure becomes, and a message that names the bad argument or
// the missing resource. Framework-free; csrc/tf and csrc/python map the codes.
#pragma once

#include <string>
#include <utility>

namespace tfbigconv {

enum class StatusCode {
  kOk,
  kInvalidArgument,    // a bad argument: InvalidArgumentError / ValueError
  kResourceExhausted,  // nothing fits the workspace limit: ResourceExhaustedError
  kUnavailable,        // a requested algorithm cannot run here (e.g. no cuFFT)
  kInternal,           // a launch failed (e.g. a CUDA runtime error): InternalError
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace tfbigconv
