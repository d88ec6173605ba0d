// Which operator actions a task's status allows: the API's rules (mscheduler/operations.py),
// so that the pages show only the buttons that can work. The API still decides: a task that
// changed meanwhile gets its refusal (409, with the rule) shown.

const LIVE = new Set(["pending", "running"]);
const RESTARTABLE = new Set(["failed", "cancelled", "expired"]);

/** The actions of one task: cancel, pause, resume, restart (force: a succeeded task), remove
 *  (force: a running one), mark-succeeded, mark-failed. */
export function taskActions(task) {
  const actions = new Set();
  const live = LIVE.has(task.status);
  if (live) {
    actions.add("cancel");
    actions.add(task.paused ? "resume" : "pause");
  }
  if (RESTARTABLE.has(task.status)) actions.add("restart");
  if (task.status === "succeeded" && !task.children) actions.add("rerun");
  if (!task.parent) actions.add(task.status === "running" ? "remove-running" : "remove");
  if (!task.children && !task.running_cnt) {
    if (task.status === "pending" || RESTARTABLE.has(task.status)) actions.add("mark-succeeded");
    if (task.status === "pending") actions.add("mark-failed");
  }
  return actions;
}

/** The bulk actions (cancel, pause, resume, restart, remove) that apply to at least one of
 *  these tasks; each button then acts on all of them, and those it does not apply to come
 *  back refused with the rule. */
export function bulkActions(tasks) {
  const found = new Set();
  for (const task of tasks) {
    for (const action of taskActions(task)) {
      if (action === "rerun") found.add("restart");
      else if (action.startsWith("remove")) found.add("remove");
      else if (!action.startsWith("mark")) found.add(action);
    }
  }
  return BULK.filter((a) => found.has(a));
}

/** The bulk actions that may apply to the tasks of a status filter (any status: all). */
export function bulkActionsForStatus(status) {
  if (!status) return [...BULK];
  if (LIVE.has(status)) return ["cancel", "pause", "resume", "remove"];
  if (RESTARTABLE.has(status) || status === "succeeded") return ["restart", "remove"];
  return [...BULK];
}

export const BULK = ["cancel", "pause", "resume", "restart", "remove"];

/** The first line of the task's last error ("Type: message"), or "". */
export function lastError(task) {
  let error = task.broken ?? null;
  if (!error) {
    for (let i = task.worker_states.length - 1; i >= 0 && !error; i--) error = task.worker_states[i].error ?? null;
  }
  if (!error) return "";
  return `${error.type}: ${error.message ?? ""}`.split(/\r?\n/)[0];
}

/** A progress fraction to show: a succeeded task is done (100 %), whatever it last said. */
export function shownProgress(task) {
  if (task.status === "succeeded") return task.progress ? 1 : null;
  return task.progress ? Math.max(0, Math.min(1, task.progress.fraction)) : null;
}
