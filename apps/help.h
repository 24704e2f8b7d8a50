#pragma once
#include <string>
namespace tpt {
std::string help_footer();   // the end of tptrain --help (the commands and their options: CLI11)
std::string version_text();  // tptrain --version
}  // namespace tpt
