/**
 * Group commit at the end of a turn of the event loop. What must be durable before an answer
 * leaves (the usage journal's lines) is written once for every exchange that ended in the turn,
 * then the answers that waited for it are sent: one `write` for a turn's records instead of one per
 * record, and no answer reaches its client before its record is in the kernel.
 *
 * Both run in one `setImmediate`, in the check phase right after the poll phase whose events ended
 * the exchanges: an answer waits for the rest of that phase's events, not for a timer. Steps do not
 * throw (each catches and reports its own failures). A step added while a drain runs (a reply sent
 * from inside another) goes in the next drain, so commits always precede the sends they guard.
 */
type Step = () => void;

let commits: Step[] = [];
let sends: Step[] = [];
let scheduled = false;

/** Runs `commit` at the end of this turn, before every send waiting there. */
export function commitAtTurnEnd(commit: Step): void {
  commits.push(commit);
  schedule();
}

/** Runs `send` at the end of this turn, after every commit made in it. */
export function sendAtTurnEnd(send: Step): void {
  sends.push(send);
  schedule();
}

function schedule(): void {
  if (scheduled) return;
  scheduled = true;
  setImmediate(drain);
}

function drain(): void {
  scheduled = false;
  const committing = commits;
  const sending = sends;
  commits = [];
  sends = [];
  for (const commit of committing) commit();
  for (const send of sending) send();
}
