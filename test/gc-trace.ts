/**
 * Reads V8's `--trace-gc-nvp` records out of a process's stdout and sums what the heap took in
 * between collections, the cost guard's measure of garbage per exchange.
 *
 * One record is one line: `[pid:0xisolate]     123 ms: pause=… gc=s … total_size_before=N
 * total_size_after=N … allocated=N … unmapper_chunks=N` (a mark-compact adds `compaction_speed=N`).
 * V8 prints the `[pid:isolate] … ms: ` head and the `pause=…` body with two separate printf calls,
 * and every thread's isolate prints to the same stdout, so two threads collecting at once can leave
 * a line with two heads and the next line with none. Such lines are left out: only a line that is
 * exactly one head and one body counts, and it counts for the isolate its head names.
 *
 * V8's own `allocated=` is `start_object_size - previous.end_object_size` printed as an unsigned
 * size_t: when the heap shrank between two collections (the sweeper freeing what a mark-compact
 * found dead, after its pause), it wraps to 2^64 less a little, which once read as 6 × 10^12 KB per
 * exchange. So the sum is taken here, per isolate, as signed differences between one record's
 * `total_size_before` and the previous record's `total_size_after`; over a run these add up to what
 * the collections freed plus what the heap grew by, which is what the program allocated.
 */

const RECORD = /^\[(\d+:0x[0-9a-f]+)\] +\d+ ms: (pause=[\d.]+ mutator=[\d.]+ gc=\w+(?: [\w.]+=[\d.]+%?)+)$/;

/** Bytes allocated since each isolate's first complete record, over all isolates in `stdout`. */
export function allocatedBytes(stdout: string): number {
  const lastAfter = new Map<string, number>();
  let sum = 0;
  // Only lines ended by a newline: the last one may still be arriving.
  const complete = stdout.slice(0, stdout.lastIndexOf('\n') + 1);
  for (const line of complete.split('\n')) {
    const record = RECORD.exec(line);
    if (!record) continue;
    const fields = new Map(record[2]!.split(' ').map((pair) => pair.split('=') as [string, string]));
    const before = Number(fields.get('total_size_before'));
    const after = Number(fields.get('total_size_after'));
    if (!Number.isSafeInteger(before) || !Number.isSafeInteger(after)) continue;
    const previous = lastAfter.get(record[1]!);
    if (previous !== undefined) sum += before - previous;
    lastAfter.set(record[1]!, after);
  }
  return sum;
}

/**
 * Bytes the scavenges promoted to the old generation (`promoted=` of each `gc=s` record), over all
 * isolates in `stdout`: what outlived two scavenges. An exchange's objects should die young; what
 * is promoted per exchange is what something kept past its end (src/live-set.ts tells of one case).
 */
export function promotedBytes(stdout: string): number {
  let sum = 0;
  const complete = stdout.slice(0, stdout.lastIndexOf('\n') + 1);
  for (const line of complete.split('\n')) {
    const record = RECORD.exec(line);
    if (!record || !record[2]!.includes(' gc=s ')) continue;
    const promoted = / promoted=(\d+)/.exec(record[2]!);
    if (promoted) sum += Number(promoted[1]);
  }
  return sum;
}
