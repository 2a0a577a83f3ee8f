/* tcp-pingpong - the reference for mep's small-message latency: a plain
 * TCP ping-pong of N-byte messages over loopback between two processes,
 * TCP_NODELAY, no framework: blocking recv, or with --spin a non-blocking
 * recv polled in a loop (as mep's transports are polled). Prints the
 * median and p99 round trip in microseconds.
 *   tcp-pingpong [--bytes 8] [--iters 20000] [--spin] */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int spin;

static int full(int fd, char *buf, size_t len, int sending) {
  for (size_t done = 0; done < len;) {
    ssize_t n = sending ? send(fd, buf + done, len - done, MSG_NOSIGNAL)
                        : recv(fd, buf + done, len - done,
                               spin ? MSG_DONTWAIT : 0);
    if (n < 0 && spin && !sending && errno == EAGAIN) continue;
    if (n <= 0) return -1;
    done += (size_t)n;
  }
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  size_t bytes = 8;
  int iters = 20000, c;
  static const struct option opts[] = {{"bytes", required_argument, 0, 'b'},
                                       {"iters", required_argument, 0, 'i'},
                                       {"spin", no_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  while ((c = getopt_long(argc, argv, "b:i:sh", opts, NULL)) != -1) {
    if (c == 's') spin = 1;
    else if (c == 'b') bytes = strtoull(optarg, NULL, 0);
    else if (c == 'i') iters = atoi(optarg);
    else {
      printf("usage: tcp-pingpong [--bytes N] [--iters N] [--spin]\n"
             "Plain TCP ping-pong over loopback (reference for mep's "
             "latency);\n--spin polls a non-blocking socket instead of "
             "blocking in recv.\n");
      return c == 'h' ? 0 : 2;
    }
  }
  if (bytes < 1 || iters < 1) return 2;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
      getsockname(lfd, (struct sockaddr *)&a, &alen)) {
    perror("tcp-pingpong: listen");
    return 1;
  }
  char *buf = calloc(1, bytes);
  int one = 1;
  pid_t pid = fork();
  if (pid == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) _exit(1);
    for (int i = 0; i < iters + 100; i++)
      if (full(fd, buf, bytes, 0) || full(fd, buf, bytes, 1)) _exit(1);
    _exit(0);
  }
  int fd = accept(lfd, NULL, NULL);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  double *rtt = malloc(sizeof *rtt * (size_t)iters);
  for (int i = 0; i < iters + 100; i++) {
    double t = now_us();
    if (full(fd, buf, bytes, 1) || full(fd, buf, bytes, 0)) {
      fprintf(stderr, "tcp-pingpong: peer closed\n");
      return 1;
    }
    if (i >= 100) rtt[i - 100] = now_us() - t;
  }
  int status;
  waitpid(pid, &status, 0);
  qsort(rtt, (size_t)iters, sizeof *rtt, cmp);
  printf("tcp-pingpong bytes=%zu iters=%d spin=%d rtt_median_us=%.2f "
         "rtt_p99_us=%.2f\n", bytes, iters, spin, rtt[iters / 2],
         rtt[(int)(iters * 0.99)]);
  free(rtt);
  free(buf);
  return 0;
}
