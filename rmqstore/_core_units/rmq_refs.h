/*
 * rmq_refs.h - the atomic word of a ReferenceResource (state.pxi).
 *
 * Included by the generated rmqstore/_core.c, after Python.h (Cython puts
 * every extern header there), through c_support.pxi; the declarations
 * Cython sees are in c_support.pxi.
 */
#ifndef RMQ_REFS_H
#define RMQ_REFS_H

/* A ReferenceResource's word: bit 0 set while a clean-up or close holds
   the references exclusively, the references held counted above it.
   Atomic operations (GCC and Clang builtins), so a hold never rests on
   the GIL: once a clean-up has set the bit, no hold can succeed, and
   the count it then waits on only falls. */
#define RMQ_REF_EXCLUSIVE ((Py_ssize_t)1)
static inline Py_ssize_t rmq_ref_load(Py_ssize_t *w) {
    return __atomic_load_n(w, __ATOMIC_ACQUIRE);
}
static inline int rmq_ref_try_hold(Py_ssize_t *w) {
    Py_ssize_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    while (!(v & RMQ_REF_EXCLUSIVE))
        if (__atomic_compare_exchange_n(w, &v, v + 2, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return 1;
    return 0;
}
/* The word after the drop (unchanged when no reference is held). */
static inline Py_ssize_t rmq_ref_drop(Py_ssize_t *w) {
    Py_ssize_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    while (v >= 2)
        if (__atomic_compare_exchange_n(w, &v, v - 2, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return v - 2;
    return v;
}
static inline void rmq_ref_set_exclusive(Py_ssize_t *w) {
    __atomic_fetch_or(w, RMQ_REF_EXCLUSIVE, __ATOMIC_SEQ_CST);
}
static inline void rmq_ref_clear_exclusive(Py_ssize_t *w) {
    __atomic_fetch_and(w, ~RMQ_REF_EXCLUSIVE, __ATOMIC_SEQ_CST);
}

#endif /* RMQ_REFS_H */
