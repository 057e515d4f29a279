# tools/install.sh under a DESTDIR: what it puts where for a system and a user's prefix, man
# pages that render, completion that completes, the example that finds iapctl on PATH, an
# uninstall that leaves nothing.
# shellcheck shell=bash

bin_dir() { dirname "$IAPCTL"; }

installed() { # once: install.sh --prefix /usr/local under $WORK/stage; $STAGE
    STAGE=$WORK/stage
    once install env DESTDIR="$STAGE" "$INSTALL_SH" --no-build --bin "$(bin_dir)" --prefix /usr/local
    exit_was 0
}

check "install.sh puts iapctl, its man page and its bash, zsh and fish completions under the prefix" check_install_files
check_install_files() {
    local file missing=0
    installed
    for file in bin/iapctl share/man/man1/iapctl.1 share/bash-completion/completions/iapctl share/zsh/site-functions/_iapctl \
                share/fish/vendor_completions.d/iapctl.fish; do
        [ -f "$STAGE/usr/local/$file" ] || { echo "install did not put $file under the prefix"; missing=1; }
    done
    [ "$missing" -eq 0 ] || { cat "$OUT" "$ERR"; return 1; }
}

check "install.sh with the prefix /usr/local puts the udev rule in place" check_install_udev_rule
check_install_udev_rule() {
    installed
    [ -f "$STAGE/etc/udev/rules.d/70-mfi-accessory.rules" ] || { echo "install did not put the udev rule in place"; return 1; }
}

check "the installed man page renders without warnings, with the subcommands and EXIT STATUS" check_install_man_page
check_install_man_page() {
    command -v man > /dev/null || skip "no man(1)"
    installed
    MANWIDTH=80 man -l "$STAGE/usr/local/share/man/man1/iapctl.1" > "$T/man.txt" 2> "$T/man.err" \
        || { echo "man -l iapctl.1 failed:"; cat "$T/man.err"; return 1; }
    if [ -s "$T/man.err" ]; then echo "man -l iapctl.1 warned:"; cat "$T/man.err"; return 1; fi
    contains "$T/man.txt" "iapctl send"
    contains "$T/man.txt" "EXIT STATUS"
}

# bash_completes WORDS... : what the installed bash completion offers for the last word
bash_completes() {
    bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _iapctl; echo "${COMPREPLY[*]}"' \
        _ "$STAGE/usr/local/share/bash-completion/completions/iapctl" "$@"
}

check "bash completion completes 'iapctl se' to send" check_bash_completes_subcommand
check_bash_completes_subcommand() {
    local completed
    installed
    completed=$(bash_completes iapctl se)
    [ "$completed" = "send" ] || { echo "bash completion of 'iapctl se' gave '$completed', not 'send'"; return 1; }
}

check "bash completion completes 'iapctl --simulate send --verify' to --verify-echo" check_bash_completes_option
check_bash_completes_option() {
    local completed
    installed
    completed=$(bash_completes iapctl --simulate send --verify)
    [ "$completed" = "--verify-echo" ] || { echo "bash completion of 'iapctl send --verify' gave '$completed'"; return 1; }
}

check "zsh completion offers send for 'iapctl se'" check_zsh_completes_subcommand
check_zsh_completes_subcommand() {
    local completed
    command -v zsh > /dev/null || skip "no zsh"
    installed
    # compsys stubbed: what the function offers
    completed=$(zsh -c '_describe() { local name=$4; print -l -- ${(P)name} | cut -d: -f1; }; compadd() { shift; print -l -- "$@"; }
                        _files() { :; }; compset() { :; }; source "$1" > /dev/null; words=(iapctl se); CURRENT=2; _iapctl | grep "^se"' \
                    _ "$STAGE/usr/local/share/zsh/site-functions/_iapctl" 2>&1)
    [ "$completed" = "send" ] || { echo "zsh completion of 'iapctl se' gave '$completed', not 'send'"; return 1; }
}

check "fish completion completes 'iapctl se' to send" check_fish_completes_subcommand
check_fish_completes_subcommand() {
    local completed
    command -v fish > /dev/null || skip "no fish"
    installed
    completed=$(fish -c 'source $argv[1]; complete -C "iapctl se"' "$STAGE/usr/local/share/fish/vendor_completions.d/iapctl.fish" 2>&1 | cut -f1)
    [ "$completed" = "send" ] || { echo "fish completion of 'iapctl se' gave '$completed', not 'send'"; return 1; }
}

# The example finds iapctl on PATH (no IAPCTL): an upgrade of the simulator's firmware updater.
check "firmware-upgrade.py finds the installed iapctl on PATH and upgrades the simulator's firmware" check_firmware_example_on_path
check_firmware_example_on_path() {
    local pty simulator firmware
    installed
    firmware=$(data_file fw.bin 300000)
    coproc FW { exec "$IAPCTL" simulate --profile firmware-updater 2> /dev/null; }
    simulator=$FW_PID
    on_exit stop_process "$simulator"
    read -r -t 20 -u "${FW[0]}" pty && [ -n "$pty" ] || { echo "the firmware updater did not announce its pty"; return 1; }
    exits 0 env -u IAPCTL PATH="$STAGE/usr/local/bin:$PATH" python3 "$FIRMWARE_UPGRADE" --serial "$pty" --timeout 30 "$firmware" 3.0.0
}

check "firmware-upgrade.py without iapctl on PATH exits 69" check_firmware_example_no_iapctl
check_firmware_example_no_iapctl() {
    local firmware
    firmware=$(data_file fw.bin 300000)
    exits 69 env -u IAPCTL PATH=/usr/bin:/bin python3 "$FIRMWARE_UPGRADE" "$firmware" 3.0.0
}

check "firmware-upgrade.py with a bad option is a usage error (64)" check_firmware_example_usage
check_firmware_example_usage() {
    local firmware
    firmware=$(data_file fw.bin 300000)
    exits 64 python3 "$FIRMWARE_UPGRADE" --window 0 "$firmware" 3.0.0
}

check "uninstall removes every file the install put under the prefix and in /etc" check_uninstall
check_uninstall() {
    local left
    installed
    exits 0 env DESTDIR="$STAGE" "$INSTALL_SH" --uninstall --prefix /usr/local
    left=$(find "$STAGE" -type f | head -5)
    [ -z "$left" ] || { echo "uninstall left files behind: $left"; return 1; }
}

# A user's prefix keeps to itself: nothing outside it (no /etc, no /usr/lib), and it says what it
# left out; --system-files puts the system files in place all the same (issue 35).
user_installed() { # once: install.sh --prefix /home/someone/.local under $WORK/userstage; $USERSTAGE
    USERSTAGE=$WORK/userstage
    once user-install env DESTDIR="$USERSTAGE" "$INSTALL_SH" --no-build --bin "$(bin_dir)" --prefix /home/someone/.local
    exit_was 0
}

check "install.sh with a user's prefix installs iapctl and writes nothing outside the prefix" check_user_install_keeps_to_prefix
check_user_install_keeps_to_prefix() {
    local outside
    user_installed
    outside=$(find "$USERSTAGE" -type f -not -path "$USERSTAGE/home/someone/.local/*" | head -5)
    [ -z "$outside" ] || { echo "install.sh --prefix ~/.local wrote outside its prefix: $outside"; return 1; }
    [ -f "$USERSTAGE/home/someone/.local/bin/iapctl" ] || { echo "install.sh --prefix ~/.local did not install iapctl:"; cat "$OUT" "$ERR"; return 1; }
}

check "install.sh with a user's prefix says what it left out (--system-files)" check_user_install_says_left_out
check_user_install_says_left_out() {
    user_installed
    cat "$OUT" "$ERR" > "$T/install.out"
    contains "$T/install.out" "--system-files"
}

check "uninstall of a user's prefix leaves nothing" check_user_uninstall
check_user_uninstall() {
    local left
    user_installed
    exits 0 env DESTDIR="$USERSTAGE" "$INSTALL_SH" --uninstall --prefix /home/someone/.local
    left=$(find "$USERSTAGE" -type f | head -5)
    [ -z "$left" ] || { echo "uninstall of a user prefix left files behind: $left"; return 1; }
}

system_files_installed() { # once: install.sh --prefix /opt/accessoryhost --system-files under $WORK/sysstage; $SYSSTAGE
    SYSSTAGE=$WORK/sysstage
    once system-files-install env DESTDIR="$SYSSTAGE" "$INSTALL_SH" --no-build --bin "$(bin_dir)" --prefix /opt/accessoryhost --system-files
    exit_was 0
}

check "install.sh --system-files with another prefix puts the udev rule and an iapd.service that runs the prefix's iapd in place" check_system_files
check_system_files() {
    system_files_installed
    [ -f "$SYSSTAGE/etc/udev/rules.d/70-mfi-accessory.rules" ] || { echo "install.sh --system-files did not put the udev rule in place"; return 1; }
    [ -f "$SYSSTAGE/etc/systemd/system/iapd.service" ] || { echo "install.sh --system-files did not put iapd.service in place"; return 1; }
    contains "$SYSSTAGE/etc/systemd/system/iapd.service" "/opt/accessoryhost/bin/iapd"
}

check "uninstall --system-files leaves nothing" check_system_files_uninstall
check_system_files_uninstall() {
    local left
    system_files_installed
    exits 0 env DESTDIR="$SYSSTAGE" "$INSTALL_SH" --uninstall --system-files --prefix /opt/accessoryhost
    left=$(find "$SYSSTAGE" -type f | head -5)
    [ -z "$left" ] || { echo "uninstall --system-files left files behind: $left"; return 1; }
}

check "no .pyc file is committed" check_no_pyc_committed
check_no_pyc_committed() {
    if git -C "$ROOT" ls-files --error-unmatch '*.pyc' > /dev/null 2>&1; then
        echo "committed:"; git -C "$ROOT" ls-files '*.pyc'; return 1
    fi
}
