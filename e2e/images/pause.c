/*
 * The pod sandbox ("pause") process of the e2e images: it holds the pod's namespaces open
 * and does nothing else. It blocks in pause(), reaps any child that ends up re-parented to
 * it (it is PID 1 of the pod when the pod shares its process namespace), and exits 0 on
 * SIGTERM or SIGINT.
 *
 *   gcc -static -Os -o pause pause.c      (e2e/bin/images does this)
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) {
    (void)sig;
    stop = 1;
}

static void on_child(int sig) {
    (void)sig;
    /* Reap every child that has exited; waitpid keeps errno of the interrupted pause(). */
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static int handle(int sig, void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts("perago e2e pause");
        return 0;
    }
    if (handle(SIGTERM, on_stop) || handle(SIGINT, on_stop) || handle(SIGCHLD, on_child)) {
        perror("pause: sigaction");
        return 1;
    }
    while (!stop) {
        pause();
    }
    return 0;
}
