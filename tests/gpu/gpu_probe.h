/* gpu_probe.h - whether libmep sees a usable GPU, asked in a child
 * process: a process that touched CUDA cannot use it in the ranks it
 * forks afterwards, so the parent stays out of CUDA. */
#ifndef MEP_TESTS_GPU_PROBE_H
#define MEP_TESTS_GPU_PROBE_H

#include <sys/wait.h>
#include <unistd.h>

#include <mep/mep.h>

static inline int gpu_usable(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(mep_cuda_available() ? 0 : 1);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

#endif
