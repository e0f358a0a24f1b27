/* A hostile bundle's threads that raise their own nice level to 19 the
 * moment the server sets the thread listed before them in /proc/PID/task
 * (names sorted as strings, the order a directory read gives here), after
 * a spin of a few hundred iterations: inside the window between the
 * server's reading a thread's level and setting it. Writes one byte once
 * they wait, then never exits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define N 3

static volatile int tids[N], before[N], go;
static int base;

static void *raiser(void *arg) {
	long i = (long)arg;
	tids[i] = syscall(SYS_gettid);
	while (!go)
		sched_yield();
	int p = before[i];
	if (p != 0) {
		unsigned spin = (unsigned)tids[i] * 2654435761u % 400;
		while (getpriority(PRIO_PROCESS, p) == base)
			;
		for (volatile unsigned k = 0; k < spin; k++)
			;
		setpriority(PRIO_PROCESS, 0, 19);
	}
	for (;;)
		pause();
	return NULL;
}

static int byname(const void *a, const void *b) {
	char x[16], y[16];
	snprintf(x, sizeof x, "%d", *(const int *)a);
	snprintf(y, sizeof y, "%d", *(const int *)b);
	return strcmp(x, y);
}

int main(void) {
	base = getpriority(PRIO_PROCESS, 0);
	pthread_t t;
	for (long i = 0; i < N; i++)
		pthread_create(&t, NULL, raiser, (void *)i);
	for (int i = 0; i < N; i++)
		while (!tids[i])
			sched_yield();
	int order[N + 1];
	order[0] = getpid();
	for (int i = 0; i < N; i++)
		order[i + 1] = tids[i];
	qsort(order, N + 1, sizeof order[0], byname);
	for (int k = 1; k <= N; k++)
		for (int i = 0; i < N; i++)
			if (tids[i] == order[k])
				before[i] = order[k - 1];
	go = 1;
	if (write(1, "R", 1) != 1)
		return 1;
	for (;;)
		pause();
}
