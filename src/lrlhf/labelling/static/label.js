// The labelling page's keys: each button with data-key is clicked by its key (not while typing a comment or a name).
document.addEventListener("keydown", function (event) {
  var target = event.target;
  if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
  if (target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT")) return;
  var button = document.querySelector('button[data-key="' + event.key.toLowerCase() + '"]');
  if (button && !button.disabled) {
    event.preventDefault();
    button.disabled = true;  // one decision per page: a held or repeated key submits once
    var form = button.form;
    var field = document.createElement("input");
    field.type = "hidden"; field.name = button.name; field.value = button.value;
    if (button.name) form.appendChild(field);
    form.submit();
  }
});
