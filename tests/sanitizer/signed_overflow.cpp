// One signed overflow. Built with the project's sanitizer flags, it must stop
// at the overflow (UBSan fatal: -fno-sanitize-recover); reaching the end
// means undefined behaviour would only print a line in the test logs.
#include <climits>
#include <cstdio>

int main() {
  volatile int big = INT_MAX;
  const int wrapped = big + 1;
  std::printf("continued after undefined behaviour (%d)\n", wrapped);
  return 0;
}
