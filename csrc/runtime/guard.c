/*
 * guard.c - weights read in place from memory-mapped files that change underneath.
 *
 * A weight used in place (zero-copy, on devices that read host memory) may be a view of a mapped
 * file. Truncate that file while the model lives and the next read of a page past its new end
 * raises SIGBUS, which kills the process. Here every such range is registered with a flag of its
 * store; rlx_guard_fault, called from a SIGBUS handler, maps a page of zeros over the faulting
 * page when it lies in a registered range and raises the flag. The access then completes (reading
 * zeros), the run finishes with garbage, and the store's checks (rlx_weights_check, before and
 * after every run of a model's plans) turn the flag into RLX_ERR_IO. Anonymous memory never raises
 * SIGBUS, so a fault inside a registered range is always a file page.
 *
 * The handler must not lock or allocate: the ranges live in chunks that are appended (published
 * with a release store) and never freed; a slot is taken and released under a mutex by ordinary
 * code, and read with acquire loads by the handler.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/core.h"
#include "runtime/guard.h"

#define SLOTS_PER_CHUNK 256

struct slot {
    atomic_uintptr_t begin, end; /* [begin, end) bytes; 0, 0 when free */
    _Atomic(atomic_int *) flag;
};

struct chunk {
    struct slot slots[SLOTS_PER_CHUNK];
    _Atomic(struct chunk *) next;
};

static _Atomic(struct chunk *) head;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uintptr_t page_size;

rlx_status rlx_guard_add(const void *p, size_t bytes, atomic_int *flag, int *id)
{
    *id = -1;
    if (!p || !bytes) return RLX_OK;
    if (!atomic_load(&page_size)) atomic_store(&page_size, (uintptr_t)sysconf(_SC_PAGESIZE));
    pthread_mutex_lock(&lock);
    int base = 0;
    struct chunk *c = atomic_load_explicit(&head, memory_order_acquire), *last = NULL;
    for (; c; last = c, c = atomic_load_explicit(&c->next, memory_order_acquire), base += SLOTS_PER_CHUNK)
        for (int i = 0; i < SLOTS_PER_CHUNK; i++)
            if (!atomic_load(&c->slots[i].end)) {
                *id = base + i;
                goto found;
            }
    c = rlx_calloc(1, sizeof *c);
    if (!c) {
        pthread_mutex_unlock(&lock);
        return RLX_ERR_NOMEM;
    }
    *id = base;
    if (last)
        atomic_store_explicit(&last->next, c, memory_order_release);
    else
        atomic_store_explicit(&head, c, memory_order_release);
found:;
    struct slot *s = &c->slots[*id % SLOTS_PER_CHUNK];
    atomic_store(&s->flag, flag);
    atomic_store(&s->begin, (uintptr_t)p);
    atomic_store(&s->end, (uintptr_t)p + bytes);
    pthread_mutex_unlock(&lock);
    return RLX_OK;
}

void rlx_guard_remove(int id)
{
    if (id < 0) return;
    pthread_mutex_lock(&lock);
    struct chunk *c = atomic_load(&head);
    for (int i = 0; c && i < id / SLOTS_PER_CHUNK; i++) c = atomic_load(&c->next);
    if (c) {
        struct slot *s = &c->slots[id % SLOTS_PER_CHUNK];
        atomic_store(&s->end, 0);
        atomic_store(&s->begin, 0);
    }
    pthread_mutex_unlock(&lock);
}

bool rlx_guard_fault(void *addr)
{
    const uintptr_t a = (uintptr_t)addr, page = atomic_load(&page_size);
    for (struct chunk *c = atomic_load_explicit(&head, memory_order_acquire); c;
         c = atomic_load_explicit(&c->next, memory_order_acquire))
        for (int i = 0; i < SLOTS_PER_CHUNK; i++) {
            struct slot *s = &c->slots[i];
            if (a < atomic_load(&s->begin) || a >= atomic_load(&s->end)) continue;
            void *p = (void *)(a & ~(page - 1));
            /* mmap is a plain system call on Linux: safe in a signal handler */
            if (mmap(p, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) return false;
            atomic_int *flag = atomic_load(&s->flag);
            if (flag) atomic_store(flag, 1);
            return true;
        }
    return false;
}
