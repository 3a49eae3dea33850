#include "headroom/dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"

namespace headroom::dist {

namespace fs = std::filesystem;

namespace {

// A port the kernel hands out now; the store binds it a moment later (torchrun does the same).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) throw Error(std::string("--nproc: no socket for the rendezvous port: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(s);
    throw Error(std::string("--nproc: no free local port for the rendezvous: ") + std::strerror(errno));
  }
  ::close(s);
  return ntohs(a.sin_port);
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + (sigabbrev_np(sig) ? std::string("SIG") + sigabbrev_np(sig) : "?") + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The worker's side of the fork: torchrun's environment, then this program again with the same arguments.
[[noreturn]] void exec_worker(const std::string& program, const std::vector<std::string>& args, int rank, int n, int port,
                              const fs::path& errors) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("HEADROOM_ERROR_FILE", (errors / ("rank" + std::to_string(rank) + ".txt")).c_str(), 1);
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "--nproc: could not start worker %d: %s\n", rank, std::strerror(errno));
  std::_Exit(127);
}

// Process ids by rank.
std::vector<pid_t> start_workers(const std::string& program, const std::vector<std::string>& args, int n, int port,
                                 const fs::path& errors) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("--nproc: fork failed: ") + std::strerror(errno));
    if (pid == 0) exec_worker(program, args, r, n, port, errors);
    pids.push_back(pid);
  }
  return pids;
}

// How the workers ended: the one that failed first (and its wait status), and whether any was interrupted.
struct WorkersEnd {
  int first_failed = -1, first_status = 0, interrupted_code = 0;
};

// Reaps the workers; once one fails the others get SIGTERM, and SIGKILL if still running at o.timeout().
// `pids` entries become -1 as their workers end.
WorkersEnd wait_for_workers(std::vector<pid_t>& pids, const LaunchOptions& o) {
  WorkersEnd end;
  int running = int(pids.size());
  std::chrono::steady_clock::time_point deadline{};
  // Marks a worker ended; its rank, or -1 when `pid` is none of them. Ctrl-C stops every worker
  // at the same step (rank 0 may still be writing its checkpoint): not a failure.
  const auto reaped = [&](pid_t pid, int status) {
    for (size_t r = 0; r < pids.size(); ++r)
      if (pids[r] == pid) {
        pids[r] = -1;
        --running;
        if (WIFEXITED(status) && WEXITSTATUS(status) == kExitInterrupted) end.interrupted_code = kExitInterrupted;
        return int(r);
      }
    return -1;
  };
  const auto failed = [](int status) { return !WIFEXITED(status) || (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != kExitInterrupted); };
  while (running > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, end.first_failed >= 0 ? WNOHANG : 0);
    if (pid == 0) {  // failing: the others have until the deadline
      if (std::chrono::steady_clock::now() > deadline) {
        for (size_t r = 0; r < pids.size(); ++r)
          if (pids[r] > 0) {
            spdlog::error("--nproc: rank {} did not end within {:g} s of rank {}'s failure; killing it", r, o.timeout(), end.first_failed);
            ::kill(pids[r], SIGKILL);
          }
        deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const int rank = reaped(pid, status);
    if (rank < 0 || !failed(status) || end.first_failed >= 0) continue;
    end.first_failed = rank;
    end.first_status = status;
    // A rank killed by a signal makes its peers fail as their exchange loses it, and a peer can be
    // reaped first (waitpid takes the oldest child of those ended): of the workers already ended,
    // the one a signal killed is the cause.
    for (pid_t p; !WIFSIGNALED(end.first_status) && (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      const int r = reaped(p, status);
      if (r >= 0 && WIFSIGNALED(status)) end.first_failed = r, end.first_status = status;
    }
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGTERM);
    deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(o.timeout() * 1000));
  }
  return end;
}

}  // namespace

void write_error_file(const std::string& message) {
  const char* path = std::getenv("HEADROOM_ERROR_FILE");
  if (!path || !*path) return;
  std::ofstream out(path, std::ios::trunc);
  out << message;
}

int launch_local(const std::string& program, const std::vector<std::string>& args, const LaunchOptions& o) {
  const int n = o.nproc();
  char tmpl[] = "/tmp/headroom-launch-XXXXXX";
  if (!::mkdtemp(tmpl)) throw Error(std::string("--nproc: no folder for the workers' error files: ") + std::strerror(errno));
  const fs::path errors(tmpl);
  const int port = free_port();
  spdlog::info("--nproc {}: starting {} workers (rendezvous 127.0.0.1:{})", n, n, port);
  std::vector<pid_t> pids = start_workers(program, args, n, port, errors);
  // Ctrl-C reaches the workers (one process group) and they stop together; the launcher waits.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old_int {};
  ::sigaction(SIGINT, &ignore, &old_int);
  const WorkersEnd end = wait_for_workers(pids, o);
  ::sigaction(SIGINT, &old_int, nullptr);
  int code = end.interrupted_code;
  if (end.first_failed >= 0) {
    const std::string why = read_text(errors / ("rank" + std::to_string(end.first_failed) + ".txt"));
    spdlog::error("--nproc {}: rank {} {}{}{}; the other workers were stopped", n, end.first_failed, describe(end.first_status),
                  why.empty() ? "" : ": ", why);
    code = exit_code_of(end.first_status);
    if (code == 0) code = kExitFailure;
  }
  std::error_code ec;
  fs::remove_all(errors, ec);
  return code;
}

}  // namespace headroom::dist
