// alpaca-train entry point: the only place that catches alpaca::Error and chooses an exit code.
#include <exception>
#include <iostream>

#include "alpaca/util/error.h"

int main(int argc, char** argv) {
  try {
    std::cout << "alpaca-train: the CLI is not wired yet\n";
    return 0;
  } catch (const alpaca::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
