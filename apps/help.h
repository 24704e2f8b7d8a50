#pragma once
#include <string>
namespace tpt {
std::string help_text();
std::string version_text();
}  // namespace tpt
