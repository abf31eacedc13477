/* Preloaded (LD_PRELOAD) into a process run under valgrind --tool=callgrind by bench/callgrind.py:
 * SIGRTMIN+5 zeroes callgrind's counters, SIGRTMIN+6 dumps them to <out-file>.<n>, so that one
 * process can be counted over exactly the statements of a run (start-up and idle time left out).
 * Each handler appends one byte to $RP_CALLGRIND_MARKS once done ('z', 'd'): the benchmark waits
 * for it. Both the handlers and write(2) are async-signal-safe; a client request is an inert
 * instruction sequence outside valgrind. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

static int done_fd = -1;

static void done(const char *what) {
    if (done_fd >= 0)
        (void)!write(done_fd, what, 1);
}

static void on_zero(int sig) {
    (void)sig;
    CALLGRIND_ZERO_STATS;
    done("z");
}

static void on_dump(int sig) {
    (void)sig;
    CALLGRIND_DUMP_STATS;
    done("d");
}

__attribute__((constructor)) static void install(void) {
    const char *path = getenv("RP_CALLGRIND_MARKS");
    if (path == NULL)
        return;
    done_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct sigaction sa = {0};
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_zero;
    sigaction(SIGRTMIN + 5, &sa, NULL);
    sa.sa_handler = on_dump;
    sigaction(SIGRTMIN + 6, &sa, NULL);
}
