/* A TCP relay that puts a distance between its clients and a server: every
 * byte waits DELAY before it is passed on, each way, and a new connection's
 * first bytes wait as long as a TCP handshake over that distance would have
 * taken. testkit/delayline.py builds and runs it; why it exists is said
 * there (this kernel has no netem).
 *
 *     delayline LISTEN_ADDR LISTEN_PORT TARGET_ADDR TARGET_PORT DELAY_US
 *
 * Prints "listening" on stdout once it accepts. One thread, epoll, no
 * allocation per byte beyond one buffer per read; a read's bytes are held in
 * a queue per direction until due, then written in order. A direction stops
 * reading while it holds more than MAX_HELD bytes (the far side is slow).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_SIZE (64 * 1024)
#define MAX_HELD (4 * 1024 * 1024)
#define MAX_EVENTS 256

struct chunk {
    struct chunk *next;
    int64_t due;    /* monotonic microseconds */
    size_t len, off;
    char data[];
};

struct side;

struct conn {
    struct side *a, *b;  /* a: the client's socket, b: the server's */
    int64_t opened;
    int dead;
    struct conn *prev, *next;  /* every connection, for the timer's scan: a few hundred at most */
    struct conn *next_dead;
};

struct side {
    int fd;
    struct conn *conn;
    struct side *peer;        /* where what this side reads goes */
    struct chunk *head, *tail; /* held bytes read here, waiting to be written to peer */
    size_t held;
    int eof;                  /* this side sent FIN: pass it on once the queue drains */
    int shut;                 /* the FIN was passed on */
    int reading;              /* registered for EPOLLIN */
    int writing;              /* peer registered for EPOLLOUT on our behalf */
    int hup;                  /* closed both ways: out of epoll, nothing more to read or write */
    int is_client;
};

static int ep;
static int64_t delay;
static struct conn *all_dead, *conns;

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}


/* Each side's fd is registered with the side as its pointer; the events wanted are recomputed here. */
static void rearm(struct side *s) {
    if (s->hup) return;
    struct epoll_event ev = {0};
    ev.data.ptr = s;
    if (s->reading) ev.events |= EPOLLIN | EPOLLRDHUP;
    if (s->peer->writing) ev.events |= EPOLLOUT;
    epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
}

static void kill_conn(struct conn *c) {
    if (c->dead) return;
    c->dead = 1;
    c->next_dead = all_dead;
    all_dead = c;
}

static void free_side(struct side *s) {
    struct chunk *k = s->head;
    while (k) {
        struct chunk *n = k->next;
        free(k);
        k = n;
    }
    close(s->fd);
    free(s);
}

static void reap(void) {
    while (all_dead) {
        struct conn *c = all_dead;
        all_dead = c->next_dead;
        if (c->prev) c->prev->next = c->next; else conns = c->next;
        if (c->next) c->next->prev = c->prev;
        free_side(c->a);
        free_side(c->b);
        free(c);
    }
}

/* The earliest a byte read from the client now may reach the server: after
 * one delay, and never before the handshake the relay skipped (SYN out,
 * SYN-ACK back: a round trip) plus the delay of the bytes themselves. */
static int64_t due_of(struct side *s, int64_t t) {
    int64_t due = t + delay;
    if (s->is_client && due < s->conn->opened + 3 * delay) due = s->conn->opened + 3 * delay;
    if (s->tail && due < s->tail->due) due = s->tail->due;
    return due;
}

static void read_side(struct side *s) {
    while (s->held < MAX_HELD) {
        struct chunk *k = malloc(sizeof *k + READ_SIZE);
        if (!k) abort();
        ssize_t n = read(s->fd, k->data, READ_SIZE);
        if (n > 0) {
            k->len = (size_t)n;
            k->off = 0;
            k->next = NULL;
            k->due = due_of(s, now_us());
            if (s->tail) s->tail->next = k; else s->head = k;
            s->tail = k;
            s->held += (size_t)n;
            if (n < READ_SIZE) return;
            continue;
        }
        free(k);
        if (n == 0) {
            s->eof = 1;
            s->reading = 0;
            rearm(s);
            return;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        kill_conn(s->conn);
        return;
    }
    s->reading = 0;  /* the far side is slow: hold no more until it drains */
    rearm(s);
}

/* Write what is due of what `s` read to its peer; returns the next due time still held, or 0. */
static int64_t flush_side(struct side *s, int64_t t) {
    struct side *to = s->peer;
    while (s->head && s->head->due <= t) {
        struct chunk *k = s->head;
        ssize_t n = write(to->fd, k->data + k->off, k->len - k->off);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!s->writing) { s->writing = 1; rearm(to); }
                return 0;
            }
            if (errno == EINTR) continue;
            kill_conn(s->conn);
            return 0;
        }
        k->off += (size_t)n;
        s->held -= (size_t)n;
        if (k->off < k->len) continue;
        s->head = k->next;
        if (!s->head) s->tail = NULL;
        free(k);
    }
    if (s->writing) { s->writing = 0; rearm(to); }
    if (!s->eof && !s->reading && s->held < MAX_HELD / 2) { s->reading = 1; rearm(s); }
    if (!s->head && s->eof && !s->shut) {
        s->shut = 1;
        shutdown(to->fd, SHUT_WR);
        if (s->peer->shut) kill_conn(s->conn);
    }
    return s->head ? s->head->due : 0;
}

static struct side *new_side(int fd, struct conn *c, int is_client) {
    struct side *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->fd = fd;
    s->conn = c;
    s->reading = 1;
    s->is_client = is_client;
    return s;
}

static void accept_all(int lfd, struct sockaddr_in *target) {
    for (;;) {
        int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
        if (cfd < 0) return;
        int sfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (sfd < 0 || (connect(sfd, (struct sockaddr *)target, sizeof *target) < 0 && errno != EINPROGRESS)) {
            if (sfd >= 0) close(sfd);
            close(cfd);
            continue;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(sfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (!c) abort();
        c->opened = now_us();
        c->a = new_side(cfd, c, 1);
        c->b = new_side(sfd, c, 0);
        c->a->peer = c->b;
        c->b->peer = c->a;
        c->next = conns;
        if (conns) conns->prev = c;
        conns = c;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
        ev.data.ptr = c->a;
        epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev);
        ev.data.ptr = c->b;
        epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: delayline LISTEN_ADDR LISTEN_PORT TARGET_ADDR TARGET_PORT DELAY_US\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    delay = atoll(argv[5]);
    struct sockaddr_in listen_at = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    struct sockaddr_in target = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
    if (inet_pton(AF_INET, argv[1], &listen_at.sin_addr) != 1 || inet_pton(AF_INET, argv[3], &target.sin_addr) != 1) {
        fprintf(stderr, "delayline: addresses must be IPv4 literals\n");
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&listen_at, sizeof listen_at) < 0 || listen(lfd, 4096) < 0) {
        perror("delayline: bind/listen");
        return 1;
    }
    ep = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    printf("listening\n");
    fflush(stdout);

    struct epoll_event evs[MAX_EVENTS];
    int timeout = -1;
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, timeout);
        if (n < 0 && errno != EINTR) { perror("delayline: epoll_wait"); return 1; }
        for (int i = 0; i < n; i++) {
            struct side *s = evs[i].data.ptr;
            if (!s) { accept_all(lfd, &target); continue; }
            if (s->conn->dead) continue;
            if (evs[i].events & EPOLLERR) { kill_conn(s->conn); continue; }
            if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) if (s->reading) read_side(s);
            if ((evs[i].events & EPOLLOUT) && s->peer->writing) flush_side(s->peer, now_us());
            if ((evs[i].events & EPOLLHUP) && !s->conn->dead && !s->reading) {
                /* Reported until closed: leave epoll; what it sent still goes out when due. */
                s->hup = 1;
                epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
            }
        }
        reap();
        /* Due bytes out; the timer set to the next still held. */
        timeout = -1;
        int64_t t = now_us(), next = 0;
        for (struct conn *c = conns; c; c = c->next) {
            for (int k = 0; k < 2 && !c->dead; k++) {
                int64_t due = flush_side(k ? c->b : c->a, t);
                if (due && (!next || due < next)) next = due;
            }
        }
        reap();
        if (next) {
            int64_t wait = (next - now_us() + 999) / 1000;
            timeout = wait < 0 ? 0 : (int)wait;
        }
    }
}
