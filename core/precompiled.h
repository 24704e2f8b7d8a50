// The standard and third-party headers that most of tptrain's files include, precompiled once per
// library (CMake's target_precompile_headers, TPTRAIN_PCH): on 2 cores their parsing was a third of
// each file's compile time at -O3 and half at -O0. Only headers we do not write, so that a change of
// ours never rebuilds it; every file still includes what it uses.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>
