// How near two CPUs are, for the benchmarks' notes: the round trip of a cache line between two threads pinned to
// them. Cores that share an L3 pass a line in about 150 ns on the Zen 5 EPYC VM; cores on different CCDs take
// about 400. The host of a VM may place its CPUs either way from one process to the next, and the prefill and
// decode speeds follow (docs/benchmarks-history.md, 2026-12-05), so `localchat bench` reports it per run.
#pragma once
#include "torch_api.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

// Nanoseconds per round trip of a cache line between CPUs cpu_a and cpu_b (two transfers: a to b and back), over
// `rounds` round trips after as many to warm up; -1 where the threads cannot be pinned to them.
double core_round_trip_ns(int64_t cpu_a, int64_t cpu_b, int64_t rounds) {
  TORCH_CHECK(rounds > 0 && cpu_a >= 0 && cpu_b >= 0 && cpu_a != cpu_b, "two distinct CPUs and rounds > 0");
#if defined(__linux__)
  if (cpu_a >= CPU_SETSIZE || cpu_b >= CPU_SETSIZE) return -1.0;
  struct alignas(64) Line {
    std::atomic<int64_t> value{0};
  };
  Line line;
  std::atomic<int> ready{0};
  std::atomic<bool> failed{false};
  auto pin = [&](int64_t cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cpu), &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) failed = true;
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    return !failed.load();
  };
  const int64_t total = 2 * rounds;  // the first half warms up
  double ns = -1.0;
  std::thread answer([&] {
    if (!pin(cpu_b)) return;
    for (int64_t i = 1; i <= total; ++i) {
      while (line.value.load(std::memory_order_acquire) != 2 * i - 1) {
      }
      line.value.store(2 * i, std::memory_order_release);
    }
  });
  std::thread ask([&] {
    if (!pin(cpu_a)) return;
    std::chrono::steady_clock::time_point start;
    for (int64_t i = 1; i <= total; ++i) {
      if (i == rounds + 1) start = std::chrono::steady_clock::now();
      line.value.store(2 * i - 1, std::memory_order_release);
      while (line.value.load(std::memory_order_acquire) != 2 * i) {
      }
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(rounds);
  });
  ask.join();
  answer.join();
  return failed.load() ? -1.0 : ns;
#else
  (void)cpu_a;
  (void)cpu_b;
  return -1.0;
#endif
}
