/*
 * A task body in a compiled language, for the e2e tests: a static binary that needs nothing
 * from its image (no shell, no libc) and follows the runner protocol (docs/runner-protocol.md).
 *
 * It checks that $PERAGO_PARAMS names a readable file, writes
 * {"greeting":"hello from a compiled body"} to $PERAGO_RESULT and, when $PERAGO_WORKSPACE is
 * a directory, writes "hello\n" to $PERAGO_WORKSPACE/compiled/hello.txt. It exits 0; on any
 * error it says why on standard error and exits 1; SIGTERM ends it with status 143.
 *
 *   gcc -static -Os -o perago-body-compiled body.c      (e2e/bin/images does this)
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char RESULT[] = "{\"greeting\":\"hello from a compiled body\"}\n";

static void on_term(int sig) {
    (void)sig;
    static const char msg[] = "perago-body-compiled: terminated\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(143);
}

static int fail(const char *what, const char *path) {
    fprintf(stderr, "perago-body-compiled: %s %s: %s\n", what, path, strerror(errno));
    return 1;
}

static const char *required(const char *name) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') {
        fprintf(stderr, "perago-body-compiled: $%s is not set\n", name);
        return NULL;
    }
    return value;
}

/* Write all of `text` to `path` (created or truncated), then close it. */
static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        return fail("cannot create", path);
    }
    size_t left = strlen(text);
    while (left > 0) {
        ssize_t n = write(fd, text, left);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            int saved = errno;
            close(fd);
            errno = saved;
            return fail("cannot write", path);
        }
        text += n;
        left -= (size_t)n;
    }
    if (close(fd) != 0) {
        return fail("cannot close", path);
    }
    return 0;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0) {
        perror("perago-body-compiled: sigaction");
        return 1;
    }

    const char *params = required("PERAGO_PARAMS");
    const char *result = required("PERAGO_RESULT");
    if (params == NULL || result == NULL) {
        return 1;
    }
    if (access(params, R_OK) != 0) {
        return fail("cannot read the params file", params);
    }

    const char *workspace = getenv("PERAGO_WORKSPACE");
    struct stat st;
    if (workspace != NULL && *workspace != '\0' && stat(workspace, &st) == 0 &&
        S_ISDIR(st.st_mode)) {
        char dir[4096], file[4096];
        if (snprintf(dir, sizeof dir, "%s/compiled", workspace) >= (int)sizeof dir ||
            snprintf(file, sizeof file, "%s/hello.txt", dir) >= (int)sizeof file) {
            fprintf(stderr, "perago-body-compiled: workspace path too long: %s\n", workspace);
            return 1;
        }
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            return fail("cannot create", dir);
        }
        if (write_file(file, "hello\n") != 0) {
            return 1;
        }
    }

    if (write_file(result, RESULT) != 0) {
        return 1;
    }
    return 0;
}
