/*
 * rmq_objects.h - Python objects without calls: a compact int's value,
 * a weak reference's referent, tuple subclass instances.
 *
 * Included by the generated rmqstore/_core.c, after Python.h (Cython puts
 * every extern header there), through c_support.pxi; the declarations
 * Cython sees are in c_support.pxi.
 */
#ifndef RMQ_OBJECTS_H
#define RMQ_OBJECTS_H

/* An exact int that fits one machine word, into *v*, without a call:
   3.12+ has public (unstable-tier) API for a "compact" int, the ints a
   store passes (ms timestamps, offsets). 0 for anything else, and
   always before 3.12: the caller takes PyLong_AsLongLongAndOverflow. */
static inline int rmq_small_long(PyObject *o, long long *v) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyLong_CheckExact(o) || !PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
    *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
    return 1;
#else
    (void)o; (void)v;
    return 0;
#endif
}
/* The referent of a weak reference (a new reference), None once it is
   gone: PyWeakref_GetObject's borrowed reference is deprecated in 3.13. */
static inline PyObject *rmq_deref(PyObject *ref) {
    PyObject *o;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(ref, &o) < 0) return NULL;
    if (o == NULL) o = Py_NewRef(Py_None);
#else
    o = PyWeakref_GetObject(ref);
    Py_XINCREF(o);
#endif
    return o;
}
/* An instance of the n-tuple subclass *tp* of *items*, without calling
   its Python-level __new__. With *untrack* the GC stops tracking it: a
   tuple of immutable fields in a type with no __dict__ can join no
   cycle worth collecting, and a batch's results would otherwise be
   traversed by every young collection while the batch runs. */
static PyObject *rmq_tuple_n(PyObject *tp, int untrack, Py_ssize_t n, PyObject **items) {
    PyObject *r = ((PyTypeObject *)tp)->tp_alloc((PyTypeObject *)tp, n);
    Py_ssize_t i;
    if (r == NULL) return NULL;
    for (i = 0; i < n; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(r, i, items[i]);
    }
    if (untrack && PyObject_GC_IsTracked(r))
        PyObject_GC_UnTrack(r);
    return r;
}
static PyObject *rmq_tuple6(PyObject *tp, int untrack, PyObject *a, PyObject *b, PyObject *c,
                            PyObject *d, PyObject *e, PyObject *f) {
    PyObject *items[6] = {a, b, c, d, e, f};
    return rmq_tuple_n(tp, untrack, 6, items);
}
static PyObject *rmq_tuple5(PyObject *tp, PyObject *a, PyObject *b, PyObject *c, PyObject *d, PyObject *e) {
    PyObject *items[5] = {a, b, c, d, e};
    return rmq_tuple_n(tp, 0, 5, items);
}

#endif /* RMQ_OBJECTS_H */
